"""Where the model calls of an execution go: at start, and when its engine leaves rollout.

The order is the separate pool first, then rollout cells in reverse index order: cells leave rollout
in index order (core first), so the highest-index cell is the one expected to stay longest, and an
execution moved there is not moved again within the burst. New executions are placed in the same
order for the same reason.

Pure functions: the scheduler policy uses them, and the proxy shell may call `reroute_destination`
directly when an engine fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.scheduler.policy.roles import SEPARATE_POOL, Engine, Role


def destination_order(roles: Sequence[Role], separate_pool_capacity: int) -> list[Engine]:
    """Engines that serve rollout, in preference order: the pool, then cells K-1 down to 0."""
    order: list[Engine] = [SEPARATE_POOL] if separate_pool_capacity > 0 else []
    order.extend(cell for cell in range(len(roles) - 1, -1, -1) if roles[cell] is Role.ROLLOUT)
    return order


def fill_destinations(
    order: Sequence[Engine], free: Callable[[Engine], int], count: int, *, exclude: Engine | None = None
) -> list[tuple[Engine, int]]:
    """Spread `count` executions over engines in `order`, each up to its free capacity.

    Raises ValueError when the engines cannot take them all (the waterlevel rule prevents that).
    """
    plan: list[tuple[Engine, int]] = []
    left = count
    for engine in order:
        if left == 0:
            break
        if engine == exclude:
            continue
        take = min(left, free(engine))
        if take > 0:
            plan.append((engine, take))
            left -= take
    if left:
        raise ValueError(f"no rollout capacity for {left} of {count} executions")
    return plan


def reroute_destination(
    roles: Sequence[Role],
    loads: dict[Engine, int],
    *,
    cell_capacity: int,
    separate_pool_capacity: int,
    source: Engine,
) -> Engine | None:
    """The engine one execution leaving `source` should move to, or None when every engine is full."""
    for engine in destination_order(roles, separate_pool_capacity):
        if engine == source:
            continue
        capacity = separate_pool_capacity if engine == SEPARATE_POOL else cell_capacity
        if loads.get(engine, 0) < capacity:
            return engine
    return None
