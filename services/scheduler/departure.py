"""A cell leaves the pool with notice: `gyre cell drain ID` → the scheduler's `DrainCell` → `CellLeaving`.
A deployed cell may send its own (`gyre cell notice`, a cell pod's preStop), for its own cell only: the caller's
certificate must name the cell (gyre.authz `OWN_CELL`).

The notice is checked inside the driver's serialized apply (against the roles as they are when it applies),
then fed to the policy, which answers a rollout satellite with its executions rerouted and `RemoveCell`.
The executor (removal.py `_leave`) drains the cell's engine through the proxy — its in-flight calls move
to the other engines with their KV — and takes it out of the proxy's table; `DrainCell` answers then, with
what moved. Until that drain ends the cell is in `ShellState.departing` (persisted: a restarted scheduler
drains it again) and `GetState` shows it DRAINING, so the stack's supervisor, which stops the process of a
cell the scheduler shows GONE (app/stack/supervisor.py), stops it only after its KV moved.

A drain the proxy fails (it named no serving destination by then, or the RPC failed past its retries) does not
stop the scheduler: the cell still leaves the proxy's table and the pool, and the notice answers `DrainFailed`
(ABORTED) with the proxy's error.

Refused, with nothing changed: an unknown cell (ValueError: INVALID_ARGUMENT), and (`LeaveRefused`:
FAILED_PRECONDITION) the core (its hand-over is not built yet), a cell already gone, a cell switching roles,
and the only engine serving rollout (its calls would have nowhere to move).

A training satellite may leave: it has no engine serving calls, so its notice answers at once with nothing
moved, and the policy puts back in its queue what it knows the cell claimed of the open batch. The agent itself
is not told: it keeps claiming and computing micro-steps until the stack stops it (about a second: the
supervisor polls the roles). What it finished by then counts — computed on the batch's weights, it is exact,
and the step record takes each micro-step once. Stopped mid-step, it leaves the step before its service stops
(services/cell_agent/agent.py `leave_step`): while the window is open it gives back every micro-step it holds
and is left out; once the window closed it finishes the reduction.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.scheduler.driver import Driver
from services.scheduler.policy import CellLeaving, Role, destination_order
from services.scheduler.policy.state import PolicyState


class LeaveRefused(Exception):
    """The cell cannot leave now; the message says why (FAILED_PRECONDITION)."""


class DrainFailed(Exception):
    """The cell left the pool, but the proxy did not drain its engine (ABORTED): its calls in flight were not
    moved with their KV; they fail over to the other engines once its agent stops (the proxy retries a call
    whose engine is gone), recomputing their prefix."""


@dataclass(frozen=True, slots=True)
class DrainOutcome:
    """What a cell's departure moved (the proxy's drain of its engine)."""

    cell: int
    executions_moved: int
    calls_rerouted: int
    kv_migrated_tokens: int
    duration_s: float


def check_leave(state: PolicyState, cell: int, separate_pool_capacity: int) -> None:
    """Raise unless `cell` may leave the pool with notice now (see the module docstring)."""
    roles = state.roles
    if not 0 <= cell < len(roles):
        raise ValueError(f"unknown cell {cell}: the pool has cells 0..{len(roles) - 1}")
    role = roles[cell]
    if role is Role.GONE:
        raise LeaveRefused(f"cell {cell} already left the pool")
    if cell == state.core:
        raise LeaveRefused(f"cell {cell} is the core: the core's hand-over is not built yet")
    if role is Role.TRAINING:
        return  # its claimed micro-steps go back to the queue (removal.py)
    if role is not Role.ROLLOUT:
        raise LeaveRefused(
            f"cell {cell} is switching roles ({role}): give notice once it serves rollout or trains"
        )
    if not [e for e in destination_order(roles, separate_pool_capacity, state.members) if e != cell]:
        raise LeaveRefused(f"cell {cell} is the only engine serving rollout: its calls have nowhere to move")


class Departures:
    """The notices whose drain has not ended: each `DrainCell` waits on its cell's."""

    def __init__(self) -> None:
        self._pending: dict[int, asyncio.Future[DrainOutcome]] = {}

    def expect(self, cell: int) -> asyncio.Future[DrainOutcome]:
        """A notice for `cell` goes to the policy: the future its drain resolves."""
        assert cell not in self._pending, f"cell {cell} was given notice twice"
        future: asyncio.Future[DrainOutcome] = asyncio.get_running_loop().create_future()
        self._pending[cell] = future
        return future

    def drained(self, outcome: DrainOutcome) -> None:
        future = self._pending.pop(outcome.cell, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    def failed(self, cell: int, error: BaseException) -> None:
        future = self._pending.pop(cell, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def forget(self, cell: int) -> None:
        future = self._pending.pop(cell, None)
        if future is not None:
            future.cancel()


async def give_notice(
    driver: Driver, departures: Departures, cell: int, *, separate_pool_capacity: int
) -> DrainOutcome:
    """Feed the policy `CellLeaving(cell)` if the cell may leave; return once its engine is drained."""
    refusal: list[Exception] = []
    drained: list[asyncio.Future[DrainOutcome]] = []

    def leaving(now: float) -> CellLeaving | None:
        try:
            check_leave(driver.policy.state, cell, separate_pool_capacity)
        except (ValueError, LeaveRefused) as e:
            refusal.append(e)
            return None
        drained.append(departures.expect(cell))
        return CellLeaving(now, cell)

    await driver.handle(leaving)
    if refusal:
        raise refusal[0]
    if driver.policy.state.roles[cell] is not Role.GONE:  # the policy rejected it (logged by the driver)
        departures.forget(cell)
        raise LeaveRefused(f"the policy refused cell {cell}'s notice (see the scheduler's log)")
    return await asyncio.shield(drained[0])
