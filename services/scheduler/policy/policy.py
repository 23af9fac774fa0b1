"""The scheduler policy: a deterministic state machine, `handle(event) -> list[Action]`.

It owns the control plane of docs/design.md: the counters d/p/f, the capacity ledger C_R, boundary
dispatch, the start rule, waterlevel control with the supply check, serial role transitions, the
burst boundary and staleness records. It does no I/O and reads no clock: every event carries `now_s`,
and a timer it needs (the supply check's τ) comes back as a ScheduleTick action. The cells' moves —
role transitions, and a pool whose cells join, leave and are lost while the run goes on — are in
`membership.py`; every rule here reads K as the pool's members now.

Two drivers use it: the scheduler service (events from NATS, wall clock) and `sim/` (a simulated
clock). A typical life:

    policy = Policy(PolicyParams(num_cells=8, group_size=16, batch_groups=32, phi=0.5, mu=3, ...))
    actions = policy.handle(RunStarted(now_s=0.0))   # DispatchGroups, StartExecutions, OpenBatch
    ...                                              # the shell executes them and reports events
    policy.snapshot()                                # counters, waterlevel, roles, staleness
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.scheduler.policy import ledger
from services.scheduler.policy.actions import (
    Action,
    DispatchGroups,
    EndBurst,
    OpenBatch,
    PublishWeights,
    RerouteExecutions,
    ScheduleTick,
    StartExecutions,
)
from services.scheduler.policy.events import (
    BatchStreamClosed,
    CellJoined,
    CellLeaving,
    CellLost,
    CellReady,
    CheckpointWritten,
    CoreRestored,
    Event,
    ExecutionStarted,
    ExecutionTerminated,
    GroupDispatched,
    GroupPacked,
    GroupReady,
    MicroStepClaimed,
    MicroStepDone,
    RunStarted,
    StepCompleted,
    Tick,
    TransitionCompleted,
    WeightsPublished,
)
from services.scheduler.policy.membership import Membership
from services.scheduler.policy.params import Mode, PolicyParams
from services.scheduler.policy.roles import IN_TRANSITION, Role
from services.scheduler.policy.staleness import StalenessRecord
from services.scheduler.policy.state import PendingGroup, PolicySnapshot, PolicyState
from services.scheduler.policy.supply import claimable_groups


class Policy(Membership):
    def __init__(self, params: PolicyParams, state: PolicyState | None = None) -> None:
        self.params = params
        self._s = state if state is not None else PolicyState.fresh(params)
        if len(self._s.roles) < params.num_cells:
            raise ValueError(f"state has {len(self._s.roles)} cells; params say {params.num_cells}")
        self._refresh_order()
        self._handlers: dict[type[Any], Callable[[Any, list[Action]], None]] = {
            RunStarted: self._on_run_started,
            GroupDispatched: self._on_group_dispatched,
            ExecutionStarted: self._on_execution_started,
            ExecutionTerminated: self._on_execution_terminated,
            GroupReady: self._on_group_ready,
            GroupPacked: self._on_group_packed,
            MicroStepClaimed: self._on_microstep_claimed,
            MicroStepDone: self._on_microstep_done,
            BatchStreamClosed: self._on_stream_closed,
            StepCompleted: self._on_step_completed,
            TransitionCompleted: self._on_transition_completed,
            WeightsPublished: self._on_weights_published,
            Tick: _ignore,
            CellJoined: self._on_cell_joined,
            CellReady: self._on_cell_ready,
            CellLeaving: self._on_cell_leaving,
            CellLost: self._on_cell_lost,
            CheckpointWritten: self._on_checkpoint_written,
            CoreRestored: self._on_core_restored,
        }

    @property
    def state(self) -> PolicyState:
        """The live state (for persistence); mutate it only through `handle`."""
        return self._s

    def snapshot(self) -> PolicySnapshot:
        return PolicySnapshot.of(self._s, self.params, self._claimable())

    def handle(self, event: Event) -> list[Action]:
        """Apply one event; return the actions to execute, in order."""
        s = self._s
        if event.now_s < s.now_s:
            raise ValueError(
                f"events must arrive in time order: {type(event).__name__} at {event.now_s} < {s.now_s}"
            )
        s.now_s = event.now_s
        out: list[Action] = []
        self._handlers[type(event)](event, out)
        if s.run_started:
            self._start_executions(out)
            s.supply.observe(s.now_s, self._supply_holds())
            self._maybe_join(out)
            if s.restore_from is not None or s.leaving_core is not None:
                self._tend_core(out)
            if s.placement.orphaned:
                self._keep_serving(out)
        return out

    # --- events -------------------------------------------------------------------------------

    def _on_run_started(self, e: RunStarted, out: list[Action]) -> None:
        s, p = self._s, self.params
        if s.run_started:
            raise ValueError("the run has already started")
        s.run_started = True
        s.burst_start_version = s.published_version = s.version
        if p.mode is Mode.ASYNC:
            self._refill_async(out)
        self._dispatch(p.initial_dispatch_groups, out)
        self._open_batch(out)

    def _on_group_dispatched(self, e: GroupDispatched, out: list[Action]) -> None:
        if e.group_id in self._s.groups:
            raise ValueError(f"group {e.group_id!r} dispatched twice")
        if e.num_executions != self.params.group_size:
            raise ValueError(
                f"group {e.group_id!r} has {e.num_executions} executions; N is {self.params.group_size}"
            )
        self._s.groups[e.group_id] = PendingGroup(dispatch_version=e.policy_version)

    def _on_execution_started(self, e: ExecutionStarted, out: list[Action]) -> None:
        moved_to = self._s.placement.bind(e.execution_id, e.engine)
        if moved_to is not None:
            out.append(RerouteExecutions(e.engine, moved_to, (e.execution_id,)))

    def _on_execution_terminated(self, e: ExecutionTerminated, out: list[Action]) -> None:
        self._s.placement.release(e.execution_id)
        self._s.finished += 1

    def _on_group_ready(self, e: GroupReady, out: list[Action]) -> None:
        record = self._group(e.group_id)
        if not record.ready:  # a redelivered GroupReady changes nothing
            record.ready = True
            self._s.ready_unclaimed += 1

    def _on_group_packed(self, e: GroupPacked, out: list[Action]) -> None:
        s = self._s
        self._check_batch(e.step, "GroupPacked")
        record = self._group(e.group_id)
        if not record.ready:
            # The packer claims a group as soon as its last member resolved, which can be before the
            # evaluator's GroupReady reaches the bus: being packed is proof of readiness.
            record.ready = True
            s.ready_unclaimed += 1
        if record.packed_step is not None:
            raise ValueError(f"group {e.group_id!r} packed twice")
        if s.batch_packed >= self.params.batch_groups:
            raise ValueError(f"batch {e.step} already holds B={self.params.batch_groups} groups")
        record.packed_step = e.step
        s.batch_packed += 1
        s.batch_unclaimed[e.group_id] = None
        s.staleness.append(StalenessRecord(e.group_id, record.dispatch_version, e.step))

    def _on_microstep_claimed(self, e: MicroStepClaimed, out: list[Action]) -> None:
        s = self._s
        self._check_batch(e.step, "MicroStepClaimed")
        role = self._pool_role(e.cell)
        if role is Role.GONE:  # a late claim of a cell that left: the packer gives the micro-step back
            return
        if role is not Role.TRAINING:
            raise ValueError(f"cell {e.cell} claimed a micro-step while {role}")
        first_claims = s.batch_cells.setdefault(e.cell, {})
        for group_id in e.group_ids:
            if group_id in s.batch_unclaimed:
                del s.batch_unclaimed[group_id]
                first_claims[group_id] = s.groups.pop(group_id)
                s.ready_unclaimed -= 1
                s.batch_claimed += 1
            elif group_id in s.groups:
                raise ValueError(f"micro-step of group {group_id!r}, which is not packed into batch {e.step}")
        s.microsteps_in_flight += 1
        s.microsteps_by_cell[e.cell] = s.microsteps_by_cell.get(e.cell, 0) + 1

    def _on_microstep_done(self, e: MicroStepDone, out: list[Action]) -> None:
        s = self._s
        if self._pool_role(e.cell) is Role.GONE:  # released when it left
            return
        if s.microsteps_by_cell.get(e.cell, 0) > 0:
            s.microsteps_by_cell[e.cell] -= 1
        elif s.microsteps_in_flight <= sum(s.microsteps_by_cell.values()):
            # (in flight but not counted per cell: claimed before a restore from a state of format 2)
            raise ValueError(f"cell {e.cell} finished a micro-step that was never claimed")
        s.microsteps_in_flight -= 1

    def _on_stream_closed(self, e: BatchStreamClosed, out: list[Action]) -> None:
        self._check_batch(e.step, "BatchStreamClosed")
        if e.num_groups != self._s.batch_packed:
            raise ValueError(
                f"batch {e.step} closed with {e.num_groups} groups; {self._s.batch_packed} were packed"
            )
        self._s.batch_stream_closed = True

    def _on_step_completed(self, e: StepCompleted, out: list[Action]) -> None:
        s = self._s
        if e.version != s.version + 1:
            raise ValueError(f"step produced version {e.version}; expected {s.version + 1}")
        self._check_batch(s.version, "StepCompleted")
        if s.restore_from is not None:
            raise ValueError(f"step {e.version - 1} completed while a new core restores version {s.version}")
        # Groups packed but never claimed (all their executions excluded, no rows) are consumed too.
        for group_id in s.batch_unclaimed:
            del s.groups[group_id]
            s.ready_unclaimed -= 1
        s.version = e.version
        s.batch_step = None
        s.batch_cells = {}
        s.microsteps_by_cell = {}
        if s.leaving_core is not None:  # the step boundary the leaving core waited for
            self._remove(s.leaving_core, lost=False, out=out)
        if s.version - s.burst_start_version >= self.params.mu:
            self._end_burst(out)
        else:
            self._open_batch(out)

    def _on_transition_completed(self, e: TransitionCompleted, out: list[Action]) -> None:
        s = self._s
        role = self._pool_role(e.cell)
        if role is Role.GONE:  # it left during the transition
            return
        expected = {Role.TRAINING: Role.DRAINING, Role.ROLLOUT: Role.RETURNING}.get(e.role)
        if expected is None or role is not expected:
            raise ValueError(f"cell {e.cell} completed a transition to {e.role} while {role}")
        s.roles[e.cell] = e.role
        if e.role is Role.ROLLOUT:
            self._refresh_order()
            out.extend(s.placement.start_serving(e.cell))
        s.transitions_completed += 1
        s.supply.restart(s.now_s, self._supply_holds())
        before = s.members[: s.members.index(e.cell)]
        if e.role is Role.TRAINING and any(s.roles[c] in (Role.ROLLOUT, Role.RETURNING) for c in before):
            # It drained while its burst ended (a slow drain: the cell restarted under it) and the cells
            # before it returned: it returns too, so that the training cells stay a prefix. (Cells before
            # it still draining to training are not returning: drains complete in any order.)
            self._begin_transition(e.cell, Role.ROLLOUT, out)

    def _on_weights_published(self, e: WeightsPublished, out: list[Action]) -> None:
        s = self._s
        if not s.pending_publications or e.version != s.pending_publications[0]:
            raise ValueError(
                f"weights of version {e.version} published, but {s.pending_publications} were pending"
            )
        s.pending_publications.pop(0)
        s.published_version = e.version
        s.burst += 1
        self._dispatch(self.params.burst_dispatch_groups, out)

    # --- rules --------------------------------------------------------------------------------

    def _dispatch(self, num_groups: int, out: list[Action]) -> None:
        """Boundary dispatch: d grows here and nowhere else, so it is constant inside a burst."""
        first_group = self._s.dispatched // self.params.group_size
        self._s.dispatched += num_groups * self.params.group_size
        out.append(DispatchGroups(num_groups, self.params.group_size, self._s.published_version, first_group))

    def _start_executions(self, out: list[Action]) -> None:
        """Start rule: min(d − p, C_R − (p − f)), placed in reroute order (pool, then high cells)."""
        s = self._s
        n = ledger.startable(
            dispatched=s.dispatched,
            started=s.started,
            finished=s.finished,
            capacity=s.placement.rollout_capacity,
        )
        if n == 0:
            return
        placement = s.placement
        for engine in self._order:
            take = min(n, placement.free(engine))
            if take > 0:
                placement.reserve(engine, take)
                out.append(StartExecutions(engine, take, s.started))
                s.started += take
                n -= take
                if n == 0:
                    return
        raise AssertionError(f"ledger and placement disagree: {n} executions found no free engine")

    def _open_batch(self, out: list[Action]) -> None:
        s = self._s
        s.batch_step = s.version
        s.batch_packed = s.batch_claimed = 0
        s.batch_stream_closed = False
        s.batch_unclaimed = {}
        s.batch_cells = {}
        out.append(OpenBatch(s.version))
        s.supply.restart(s.now_s, self._supply_holds())

    def _claimable(self) -> int:
        s = self._s
        if s.batch_step is None:
            return 0
        return claimable_groups(
            ready_unclaimed=s.ready_unclaimed,
            batch_needs=self.params.batch_groups - s.batch_claimed,
            streaming=self.params.streaming,
        )

    def _supply_holds(self) -> bool:
        return self._claimable() >= self.params.supply_threshold

    def _next_unit(self) -> list[int]:
        """Cells that would join training next: the next member of the prefix, or every member (colocate)."""
        s, p = self._s, self.params
        members, roles = s.members, s.roles
        if p.mode is Mode.COLOCATE:
            return list(members) if all(roles[c] is Role.ROLLOUT for c in members) else []
        k = 0
        while k < len(members) and roles[members[k]] is Role.TRAINING:
            k += 1
        assert all(roles[c] is Role.ROLLOUT for c in members[k:]), f"training cells must be a prefix: {roles}"
        if k > 0 and s.restore_from is not None:
            return []  # satellites pull their snapshot from the core: not while a new core restores
        return [members[k]] if k < len(members) else []

    def _maybe_join(self, out: list[Action]) -> None:
        """Waterlevel control: the next unit joins when Eq. 2 holds and supply held for τ."""
        s, p = self._s, self.params
        if p.mode is Mode.ASYNC:
            self._refill_async(out)
            return
        if s.pending_publications or s.batch_step is None:
            return
        if any(s.roles[c] in IN_TRANSITION for c in s.members):  # transitions are serial
            return
        unit = self._next_unit()
        if not unit:
            return
        if not ledger.may_release(
            waterlevel=ledger.waterlevel(s.dispatched, s.finished),
            capacity=s.placement.rollout_capacity,
            released_capacity=len(unit) * p.cell_capacity,
        ):
            return
        due = s.supply.due_s(p.tau_s)
        if due is None:
            return
        if s.now_s < due:
            if s.tick_at_s != due:
                s.tick_at_s = due
                out.append(ScheduleTick(due))
            return
        for cell in unit:
            self._begin_transition(cell, Role.TRAINING, out)
        s.supply.restart(s.now_s, False)

    def _end_burst(self, out: list[Action]) -> None:
        """Burst end: satellites return; the core stays only under supply and Eq. 3; publish."""
        s, p = self._s, self.params
        out.append(EndBurst(s.version))
        if p.mode is not Mode.ASYNC:
            # A new core that is restoring stays: it publishes the burst's weights once restored.
            stays = self._core_stays() or (s.restore_from is not None and self._core_trains())
            for cell in list(s.members):
                leaves = cell != s.core or not stays
                if s.roles[cell] is Role.TRAINING and (leaves if p.mode is Mode.ELASTIC else not stays):
                    self._begin_transition(cell, Role.ROLLOUT, out)
        s.pending_publications.append(s.version)
        s.burst_start_version = s.version
        if s.restore_from is None:  # else the new core publishes once restored (CoreRestored)
            out.append(PublishWeights(s.version))
        self._open_batch(out)

    def _core_trains(self) -> bool:
        s = self._s
        return s.core is not None and s.roles[s.core] is Role.TRAINING

    def _core_stays(self) -> bool:
        s, p = self._s, self.params
        if not self._core_trains():
            return False
        ready = claimable_groups(
            ready_unclaimed=s.ready_unclaimed, batch_needs=p.batch_groups, streaming=p.streaming
        )
        if ready < p.supply_threshold:
            return False
        unit = len(s.members) if p.mode is Mode.COLOCATE else 1
        return ledger.core_may_stay(
            waterlevel=ledger.waterlevel(s.dispatched, s.finished),
            next_dispatch=p.burst_dispatch_groups * p.group_size,
            capacity_without_core=p.separate_pool_capacity + (len(s.members) - unit) * p.cell_capacity,
        )

    # --- checks -------------------------------------------------------------------------------

    def _group(self, group_id: str) -> PendingGroup:
        record = self._s.groups.get(group_id)
        if record is None:
            raise ValueError(f"unknown group {group_id!r} (never dispatched, or already claimed)")
        return record

    def _check_batch(self, step: int, what: str) -> None:
        if self._s.batch_step != step:
            raise ValueError(f"{what} for step {step}, but the open batch is {self._s.batch_step}")


def _ignore(event: Tick, out: list[Action]) -> None:
    """A tick only re-evaluates the rules (done after every event)."""
