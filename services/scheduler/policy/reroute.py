"""Where the model calls of an execution go: at start, and when its engine leaves rollout.

The order is the separate pool first, then rollout cells in reverse index order: cells leave rollout
in index order (core first), so the highest-index cell is the one expected to stay longest, and an
execution moved there is not moved again within the burst. New executions are placed in the same
order for the same reason. In a pool that changes, "index order" is the membership order (cells that
joined later come later), which the policy passes as `members`.

When a cell leaves or is lost, its executions must go somewhere even if every engine is full:
`spread_destinations` fills free capacity first, then spreads the rest over the serving engines
beyond their capacity (the start rule then starts nothing until the excess has finished).

Pure functions: the scheduler policy uses them, and the proxy shell may call `reroute_destination`
directly when an engine fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.scheduler.policy.roles import SEPARATE_POOL, Engine, Role


def destination_order(
    roles: Sequence[Role], separate_pool_capacity: int, members: Sequence[int] | None = None
) -> list[Engine]:
    """Engines that serve rollout, in preference order: the pool, then cells from the last member to the
    first (`members`: the membership order; by default cells K-1 down to 0)."""
    order: list[Engine] = [SEPARATE_POOL] if separate_pool_capacity > 0 else []
    cells = range(len(roles)) if members is None else members
    order.extend(cell for cell in reversed(cells) if roles[cell] is Role.ROLLOUT)
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


def spread_destinations(
    order: Sequence[Engine], free: Callable[[Engine], int], count: int, *, exclude: Engine | None = None
) -> tuple[list[tuple[Engine, int]], int]:
    """Like `fill_destinations`, but what free capacity cannot take is spread one by one over the engines
    in `order`, beyond their capacity. Returns the plan and how many found no engine at all (only when
    `order` names none but `exclude`)."""
    engines = [e for e in order if e != exclude]
    if not engines:
        return [], count
    taken = dict.fromkeys(engines, 0)
    left = count
    for engine in engines:
        take = min(left, max(0, free(engine)))
        taken[engine] += take
        left -= take
    for i in range(left):
        taken[engines[i % len(engines)]] += 1
    return [(e, n) for e, n in taken.items() if n > 0], 0


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
