"""Cells: their role transitions, and a pool that changes while the run goes on.

The paper fixes K. Here cells join, leave with notice and are lost for good, and the policy keeps every
rule of the paper on the pool as it is now (K = the members, `PolicyState.members`):

    CellJoined    the cell takes the next id, JOINING: it loads the published weights (LoadWeights)
    CellReady     it holds them: a rollout member, last in the membership order (the reroute order's
                  first choice among cells); in async it fills a missing training cell first
    CellLeaving   a rollout cell stops taking calls, its executions move (KV migrated) and it goes;
                  a training satellite's micro-steps of the open batch are released; the training core
                  hands over at the next step boundary (its successor restores the handed-over state)
    CellLost      the same at once, without migration: its executions are rerouted to recompute their
                  prefix, its micro-steps released; a lost core is replaced by the next member, which
                  restores the newest checkpoint and takes the steps after it again (`steps_lost`)
    CheckpointWritten / CoreRestored   the core's state is durable / the new core holds it

Every removal answers RemoveCell. While a new core is being restored no step completes, no satellite
joins, and weight publications wait for it (it publishes what the lost core owed). A new core that is
in rollout when a publication is owed moves to training as soon as Eq. 2 allows; otherwise it restores
when it next joins training. If a loss leaves running executions with no engine at all, the last
training cell returns to rollout to serve them (the only move against the burst, forced by the loss).
"""

from __future__ import annotations

from services.scheduler.policy import ledger
from services.scheduler.policy.actions import (
    Action,
    BeginTransition,
    LoadWeights,
    PublishWeights,
    ReleaseMicroSteps,
    RemoveCell,
    RestoreCore,
)
from services.scheduler.policy.events import (
    CellJoined,
    CellLeaving,
    CellLost,
    CellReady,
    CheckpointWritten,
    CoreRestored,
)
from services.scheduler.policy.params import Mode, PolicyParams
from services.scheduler.policy.reroute import destination_order
from services.scheduler.policy.roles import IN_TRANSITION, MEMBER_ROLES, Engine, Role
from services.scheduler.policy.state import PolicyState


class Membership:
    """The part of `Policy` that moves cells: transitions, joins, departures, the core's succession."""

    params: PolicyParams
    _s: PolicyState
    _order: list[Engine]

    # --- transitions --------------------------------------------------------------------------

    def _refresh_order(self) -> None:
        s = self._s
        self._order = destination_order(s.roles, self.params.separate_pool_capacity, s.members)

    def _begin_transition(self, cell: int, to_role: Role, out: list[Action]) -> None:
        s = self._s
        if to_role is Role.TRAINING:
            assert s.roles[cell] is Role.ROLLOUT, f"cell {cell} cannot leave rollout while {s.roles[cell]}"
            s.roles[cell] = Role.DRAINING
            self._refresh_order()
            out.extend(s.placement.stop_serving(cell, self._order))
        else:
            assert s.roles[cell] is Role.TRAINING, f"cell {cell} cannot leave training while {s.roles[cell]}"
            self._release_microsteps(cell, out)
            s.roles[cell] = Role.RETURNING
        out.append(BeginTransition(cell, to_role))

    def _release_microsteps(self, cell: int, out: list[Action]) -> None:
        """`cell` leaves training before the step: what it claimed of the open batch goes back."""
        s = self._s
        claimed = s.batch_cells.pop(cell, None)
        in_flight = s.microsteps_by_cell.pop(cell, 0)
        s.microsteps_in_flight -= in_flight
        if claimed is None or s.batch_step is None:
            return
        for group_id, record in claimed.items():
            s.groups[group_id] = record
            s.batch_unclaimed[group_id] = None
            s.ready_unclaimed += 1
            s.batch_claimed -= 1
        out.append(ReleaseMicroSteps(cell, s.batch_step))

    def _may_move_to_training(self, cell: int) -> bool:
        """Eq. 2 for one cell, and some engine keeps serving rollout after it."""
        s = self._s
        capacity = s.placement.rollout_capacity
        return capacity > self.params.cell_capacity and ledger.may_release(
            waterlevel=ledger.waterlevel(s.dispatched, s.finished),
            capacity=capacity,
            released_capacity=self.params.cell_capacity,
        )

    def _training_prefix(self) -> int:
        s = self._s
        k = 0
        while k < len(s.members) and s.roles[s.members[k]] in (Role.TRAINING, Role.DRAINING):
            k += 1
        return k

    def _refill_async(self, out: list[Action]) -> None:
        """Async keeps T training cells: the first rollout member replaces a missing one under Eq. 2 (at
        the run's start nothing is outstanding, so cells 0..T-1 move at once)."""
        s, p = self._s, self.params
        k = self._training_prefix()
        while k < min(p.async_training_cells, len(s.members)):
            if k > 0 and s.restore_from is not None:
                return  # a satellite pulls its snapshot from the core: not while a new core restores
            cell = s.members[k]
            if s.roles[cell] is not Role.ROLLOUT or not self._may_move_to_training(cell):
                return
            self._begin_transition(cell, Role.TRAINING, out)
            k += 1

    # --- the pool -----------------------------------------------------------------------------

    def _pool_role(self, cell: int) -> Role:
        if not 0 <= cell < len(self._s.roles):
            raise ValueError(f"unknown cell {cell}: the pool has ids 0..{len(self._s.roles) - 1}")
        return self._s.roles[cell]

    def _serving_version(self) -> int:
        """The version a joining cell must hold: the newest one sent to the rollout engines."""
        s = self._s
        if s.pending_publications and s.restore_from is None:
            return s.pending_publications[-1]
        return s.published_version

    def _on_cell_joined(self, e: CellJoined, out: list[Action]) -> None:
        s = self._s
        if e.cell != s.next_cell:
            raise ValueError(f"a joining cell takes the next cell id, {s.next_cell}; got {e.cell}")
        s.roles.append(Role.JOINING)
        assert s.placement.add_cell() == e.cell
        s.cells_joined += 1
        out.append(LoadWeights(e.cell, self._serving_version()))

    def _on_cell_ready(self, e: CellReady, out: list[Action]) -> None:
        s, p = self._s, self.params
        role = self._pool_role(e.cell)
        if role is Role.GONE:  # it left before it was ready
            return
        if role is not Role.JOINING:
            raise ValueError(f"cell {e.cell} reported ready while {role}")
        if e.version < self._serving_version():  # a publication went out while it loaded
            out.append(LoadWeights(e.cell, self._serving_version()))
            return
        s.roles[e.cell] = Role.ROLLOUT
        k = self._training_prefix()
        fills_training = (
            p.mode is Mode.ASYNC
            and k < p.async_training_cells
            and s.placement.orphaned == 0
            # it becomes the core only in place of a lost one; satellites wait for a restoring core
            and (k == 0) == (s.restore_from is not None)
        )
        s.members.insert(k if fills_training else len(s.members), e.cell)
        self._refresh_order()
        out.extend(s.placement.start_serving(e.cell))
        if fills_training:
            self._begin_transition(e.cell, Role.TRAINING, out)

    def _on_cell_leaving(self, e: CellLeaving, out: list[Action]) -> None:
        s = self._s
        role = self._pool_role(e.cell)
        if role is Role.GONE:
            return
        if e.cell == s.core and role is Role.TRAINING:
            s.leaving_core = e.cell  # it hands over at the next step boundary (StepCompleted)
            return
        self._remove(e.cell, lost=False, out=out)

    def _on_cell_lost(self, e: CellLost, out: list[Action]) -> None:
        if self._pool_role(e.cell) is not Role.GONE:
            self._remove(e.cell, lost=True, out=out)

    def _remove(self, cell: int, *, lost: bool, out: list[Action]) -> None:
        s = self._s
        role = s.roles[cell]
        was_core = cell == s.core
        s.roles[cell] = Role.GONE
        if role in MEMBER_ROLES:
            s.members.remove(cell)
        self._refresh_order()
        if role is Role.ROLLOUT:
            out.extend(s.placement.stop_serving(cell, self._order, recompute=lost))
        elif role is Role.TRAINING:
            self._release_microsteps(cell, out)
        if cell == s.leaving_core:
            s.leaving_core = None
        if was_core:
            s.restore_cell = None  # RestoreCore (if sent) went to this cell: its successor gets its own
            if s.restore_from is None:  # it held the core state: its successor restores it
                if lost:
                    s.steps_lost += s.version - s.durable_version
                else:
                    s.durable_version = s.version  # the hand-over makes the state durable
                s.restore_from = s.durable_version
        if lost:
            s.cells_lost += 1
        else:
            s.cells_left += 1
        out.append(RemoveCell(cell, lost))

    def _on_checkpoint_written(self, e: CheckpointWritten, out: list[Action]) -> None:
        s = self._s
        if e.version > s.version:
            raise ValueError(f"checkpoint of version {e.version}, but the core is at {s.version}")
        s.durable_version = max(s.durable_version, e.version)

    def _on_core_restored(self, e: CoreRestored, out: list[Action]) -> None:
        s = self._s
        if s.restore_cell is None or e.cell != s.restore_cell or e.version != s.version:
            raise ValueError(
                f"cell {e.cell} restored version {e.version}, but RestoreCore went to "
                f"{s.restore_cell} for version {s.version}"
            )
        s.restore_from = s.restore_cell = None
        out.extend(PublishWeights(v) for v in s.pending_publications)  # what the old core owed

    def _tend_core(self, out: list[Action]) -> None:
        """A leaving core that stopped training goes now; a new core gets RestoreCore once it trains, and
        moves there first if a publication is owed."""
        s = self._s
        if s.leaving_core is not None and s.roles[s.leaving_core] is not Role.TRAINING:
            self._remove(s.leaving_core, lost=False, out=out)
        core = s.core
        if s.restore_from is None or s.restore_cell is not None or core is None:
            return
        role = s.roles[core]
        if role is Role.TRAINING:
            s.restore_cell = core
            out.append(RestoreCore(core, s.restore_from, s.version))
        elif role is Role.ROLLOUT and s.pending_publications and self._may_move_to_training(core):
            self._begin_transition(core, Role.TRAINING, out)

    def _keep_serving(self, out: list[Action]) -> None:
        """Executions orphaned by a loss get an engine back: the last training cell returns to rollout."""
        s = self._s
        if s.placement.orphaned == 0 or s.placement.rollout_capacity > 0:
            return
        if any(s.roles[c] in IN_TRANSITION for c in s.members):
            return  # one on its way back serves them soon; one draining is the one to return, once drained
        training = [c for c in s.members if s.roles[c] is Role.TRAINING and c != s.leaving_core]
        if training and not (training[-1] == s.core and s.restore_from is not None):
            self._begin_transition(training[-1], Role.ROLLOUT, out)
