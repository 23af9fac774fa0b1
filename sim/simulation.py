"""The discrete-event cluster simulator: the scheduler policy driven by a simulated clock.

The simulator plays every part of the system except the policy: the runner (executions start and
end), the evaluator (groups become ready), the packer (`sim/packer.py`), the training cells (claim
micro-steps, reduce, step), role transitions and weight publication. It executes the policy's actions
exactly as a service shell would and reports the resulting events back, so the policy code under test
is the one the scheduler service runs. With a pool scenario (`sim/pool.py`) it also plays the cluster
manager: cells join, get notice and are lost while the run goes on (`sim/membership.py`).

    result = Simulation(PRESETS["nl2repo-122b"], layout, steps=12, seed=0).run()
    result = Simulation(preset, layout, steps=12, seed=0, pool=POOLS["spot"]).run()

Deterministic under a seed (heap ties break by scheduling order; the workload is drawn per group, the
pool's events from a generator of their own).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gyre.metrics.timeline import (
    CELL_STATE_NAMES,
    DRAINING,
    RETURNING,
    ROLLOUT,
    TRAINING_BUSY,
    TRAINING_IDLE,
)
from services.scheduler.policy import (
    Action,
    BatchStreamClosed,
    BeginTransition,
    DispatchGroups,
    EndBurst,
    Engine,
    Event,
    ExecutionStarted,
    ExecutionTerminated,
    GroupDispatched,
    GroupPacked,
    GroupReady,
    MicroStepClaimed,
    MicroStepDone,
    OpenBatch,
    Policy,
    PublishWeights,
    RerouteExecutions,
    Role,
    RunStarted,
    ScheduleTick,
    StartExecutions,
    StepCompleted,
    Tick,
    TransitionCompleted,
    WeightsPublished,
)
from sim.layout import Layout
from sim.loop import (
    CELL_READY,
    CHECKPOINT,
    EXEC_END,
    EXEC_START,
    GROUP_READY,
    MICRO_DONE,
    PUBLISH_DONE,
    STEP_DONE,
    TICK,
    TRANSITION_DONE,
    EventLoop,
)
from sim.membership import NO_STEP_S, PoolMembership, SimulationStalled
from sim.metrics import PoolUsage, SimResult
from sim.packer import SimPacker
from sim.pool import PoolScenario
from sim.presets import Preset
from sim.workload import OUTCOME_NAMES, WorkloadStream


class Simulation(PoolMembership):
    def __init__(
        self,
        preset: Preset,
        layout: Layout,
        *,
        steps: int,
        seed: int,
        record_timeline: bool = False,
        pool: PoolScenario | None = None,
    ) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1; got {steps}")
        self.preset = preset
        self.layout = layout
        self.params = layout.policy_params(preset)
        self.policy = Policy(self.params)
        self._steps = steps
        self._seed = seed
        self._training = preset.training
        self._workload = WorkloadStream(preset.workload, preset.group_size, seed)
        self._loop = EventLoop()
        self._packer = SimPacker(
            preset.training, batch_groups=preset.batch_groups, streaming=layout.streaming
        )
        self._usage = PoolUsage(layout.num_cells, record=record_timeline)
        self._record = record_timeline
        self._series: list[tuple[float, int, int, int]] = []
        self._publish_times: list[float] = []
        self._pending: deque[Event] = deque()
        self._draining_events = False
        # executions
        self._queue: deque[int] = deque()
        self._exec_name: list[str] = []
        self._exec_run_s: list[float] = []
        self._exec_eval_s: list[float] = []
        self._exec_outcome: list[int] = []
        self._exec_group: list[int] = []
        self._exec_engine: dict[int, Engine] = {}
        self._runner_free_s = 0.0
        self._running = 0
        self._started = 0
        self._finished = 0
        # groups
        self._group_name: list[str] = []
        self._group_version: list[int] = []
        self._group_left: list[int] = []
        self._group_ready_at: list[float] = []
        self._group_tokens: list[list[float]] = []
        # cells
        self._cell_role = [Role.ROLLOUT] * layout.num_cells
        self._cell_busy = [False] * layout.num_cells
        self._cell_available_s = [0.0] * layout.num_cells
        self._cell_ready_scheduled = [False] * layout.num_cells
        self._reducing = False
        self._publishing = False
        # results
        self._version = 0
        self._step_end_s: list[float] = []
        self._running_area = 0.0
        self._capacity_area = 0.0
        self._last_s = 0.0
        self._transitions = 0
        self._reroutes = 0
        self._num_events = 0
        self._init_pool(layout, seed, pool)
        self._apply_action: dict[type[Any], Callable[[Any], None]] = self._pool_actions() | {
            DispatchGroups: self._dispatch,
            StartExecutions: self._start,
            RerouteExecutions: self._reroute,
            BeginTransition: self._begin_transition,
            OpenBatch: self._open_batch,
            EndBurst: _ignore,
            PublishWeights: self._publish,
            ScheduleTick: self._schedule_tick,
        }

    # --- driver -------------------------------------------------------------------------------

    def run(self) -> SimResult:
        started = time.perf_counter()
        handlers: list[Callable[[int], None]] = [
            self._on_exec_end,
            self._on_group_ready,
            self._on_transition_done,
            self._on_micro_done,
            self._on_step_done,
            self._on_publish_done,
            self._on_tick,
            self._on_cell_ready,
            self._on_exec_start,
            self._on_cell_loaded,
            self._on_core_restored,
            self._on_checkpoint,
        ]
        assert len(handlers) == CHECKPOINT + 1
        loop, schedule = self._loop, self._schedule
        self._feed(RunStarted(0.0))
        self._sample_series(0.0)
        idle_since_s: float | None = None  # since when only pool events are left
        while self._version < self._steps:
            next_s = loop.peek_s()
            if schedule.next_s <= (math.inf if next_s is None else next_s):
                idle_since_s = self._pool_turn(idle_since_s, idle=next_s is None)
                continue
            idle_since_s = None
            item = loop.pop()
            if item is None:
                raise SimulationStalled(f"no events left at {loop.now_s:.0f} s: {self.policy.snapshot()}")
            now_s, kind, payload = item
            if now_s > self._stalled_at_s:
                self._check_progress(now_s)
            self._advance(now_s)
            handlers[kind](payload)
            self._num_events += 1
            if self._record:
                self._sample_series(now_s)
        return self._result(time.perf_counter() - started)

    def _sample_series(self, now_s: float) -> None:
        if self._record:
            s = self.policy.state
            self._series.append(
                (now_s, s.dispatched - s.finished, s.placement.rollout_capacity, self._running)
            )

    def _advance(self, now_s: float) -> None:
        dt = now_s - self._last_s
        if dt > 0:
            self._running_area += self._running * dt
            self._capacity_area += self.policy.state.placement.rollout_capacity * dt
            self._node_area += (self._present_cells * self._cell_nodes + self.layout.separate_pool_nodes) * dt
            self._usage.advance(dt)
            self._last_s = now_s

    def _feed(self, event: Event) -> None:
        """Report an event to the policy and execute its actions (events they cause queue behind)."""
        self._pending.append(event)
        if self._draining_events:
            return
        self._draining_events = True
        try:
            while self._pending:
                for action in self.policy.handle(self._pending.popleft()):
                    self._apply_action[type(action)](action)
        finally:
            self._draining_events = False

    # --- actions ------------------------------------------------------------------------------

    def _dispatch(self, a: DispatchGroups) -> None:
        now = self._loop.now_s
        for _ in range(a.num_groups):
            g = len(self._group_name)
            draw = self._workload.group(g)
            name = f"g{g}"
            self._group_name.append(name)
            self._group_version.append(a.policy_version)
            self._group_left.append(a.group_size)
            self._group_ready_at.append(0.0)
            self._group_tokens.append(draw.tokens)
            for j in range(a.group_size):
                e = len(self._exec_name)
                self._exec_name.append(f"e{e}")
                self._exec_run_s.append(draw.run_s[j])
                self._exec_eval_s.append(draw.eval_s[j])
                self._exec_outcome.append(draw.outcome[j])
                self._exec_group.append(g)
                self._queue.append(e)
            self._feed(GroupDispatched(now, name, a.group_size, a.policy_version))

    def _start(self, a: StartExecutions) -> None:
        now, loop, queue = self._loop.now_s, self._loop, self._queue
        start_s = self.preset.runner_start_s
        for _ in range(a.count):
            e = queue.popleft()
            if start_s > 0:  # the runner starts one at a time: this one when it is free
                claim_s = max(now, self._runner_free_s)
                self._runner_free_s = claim_s + start_s
                self._exec_engine[e] = a.engine
                loop.at(claim_s, EXEC_START, e)
                continue
            end_s = now + self._exec_run_s[e]
            self._exec_end[e] = (end_s, loop.at(end_s, EXEC_END, e))
            self._feed(ExecutionStarted(now, self._exec_name[e], a.engine))
            self._running += 1
            self._started += 1

    def _on_exec_start(self, e: int) -> None:
        now = self._loop.now_s
        end_s = now + self._exec_run_s[e]
        self._exec_end[e] = (end_s, self._loop.at(end_s, EXEC_END, e))
        self._running += 1
        self._started += 1
        self._feed(ExecutionStarted(now, self._exec_name[e], self._exec_engine.pop(e)))

    def _reroute(self, a: RerouteExecutions) -> None:
        self._reroutes += len(a.execution_ids)
        if a.recompute:
            self._recompute([int(name[1:]) for name in a.execution_ids])

    def _begin_transition(self, a: BeginTransition) -> None:
        now = self._loop.now_s
        cell = a.cell
        assert not self._cell_busy[cell], f"cell {cell} changes role while training a micro-step"
        if a.to_role is Role.TRAINING:
            self._cell_role[cell] = Role.DRAINING
            self._usage.set(cell, DRAINING, now)
            self._loop.at(now + self._training.join_s, TRANSITION_DONE, cell)
        else:
            self._cell_role[cell] = Role.RETURNING
            self._usage.set(cell, RETURNING, now)
            self._loop.at(now + self._training.leave_s, TRANSITION_DONE, cell)

    def _open_batch(self, a: OpenBatch) -> None:
        self._packer.open(a.step)

    def _publish(self, a: PublishWeights) -> None:
        self._publishing = True
        self._publisher = self.policy.state.core
        timer = self._loop.at(self._loop.now_s + self._training.publish_s, PUBLISH_DONE, a.version)
        self._publications_in_flight[timer] = a.version

    def _schedule_tick(self, a: ScheduleTick) -> None:
        self._loop.at(max(a.at_s, self._loop.now_s), TICK)

    # --- events -------------------------------------------------------------------------------

    def _on_exec_end(self, e: int) -> None:
        del self._exec_end[e]
        now = self._loop.now_s
        self._running -= 1
        self._finished += 1
        self._feed(ExecutionTerminated(now, self._exec_name[e], OUTCOME_NAMES[self._exec_outcome[e]]))
        g = self._exec_group[e]
        ready_at = now + self._exec_eval_s[e]
        if ready_at > self._group_ready_at[g]:
            self._group_ready_at[g] = ready_at
        self._group_left[g] -= 1
        if self._group_left[g] == 0:
            self._loop.at(self._group_ready_at[g], GROUP_READY, g)

    def _on_group_ready(self, g: int) -> None:
        self._feed(GroupReady(self._loop.now_s, self._group_name[g]))
        self._packer.add_ready(g, self._group_version[g])
        self._pump()

    def _on_transition_done(self, cell: int) -> None:
        if self._cell_role[cell] is Role.GONE:
            return
        now = self._loop.now_s
        self._transitions += 1
        if self._cell_role[cell] is Role.DRAINING:
            self._cell_role[cell] = Role.TRAINING
            self._usage.set(cell, TRAINING_IDLE, now)
            self._cell_available_s[cell] = now
            self._feed(TransitionCompleted(now, cell, Role.TRAINING))
        else:
            self._cell_role[cell] = Role.ROLLOUT
            self._usage.set(cell, ROLLOUT, now)
            self._feed(TransitionCompleted(now, cell, Role.ROLLOUT))
        self._pump()

    def _on_micro_done(self, cell: int) -> None:
        now = self._loop.now_s
        self._cell_in_flight[cell] = None
        self._cell_busy[cell] = False
        self._usage.set(cell, TRAINING_IDLE, now)
        self._packer.done()
        step = self._packer.step
        assert step is not None
        self._feed(MicroStepDone(now, cell, step))
        self._pump()

    def _on_step_done(self, version: int) -> None:
        now = self._loop.now_s
        self._reducing = False
        self._step_tokens.append(self._packer.packed_tokens)
        self._packer.finish()
        self._version = version
        self._step_end_s.append(now)
        self._stalled_at_s = now + NO_STEP_S
        writer = self.policy.state.core
        for items in self._cell_items:
            items.clear()
        self._feed(StepCompleted(now, version))
        if self._scenario.changes:
            self._checkpoint_writer[version] = writer
            self._loop.at(now + self._scenario.checkpoint_s, CHECKPOINT, version)
        training = [c for c, r in enumerate(self._cell_role) if r is Role.TRAINING and c != self._restoring]
        if self._publishing:
            available = math.inf  # the staying cells publish first (see _on_publish_done)
        else:
            available = now + (self._training.broadcast_s if len(training) > 1 else 0.0)
        for cell in training:
            self._cell_available_s[cell] = available
        self._pump()

    def _on_publish_done(self, version: int) -> None:
        first = next(iter(self._publications_in_flight))  # they complete in the order they were sent
        sent = self._publications_in_flight.pop(first)
        assert sent == version, f"publication of {version} completed before that of {sent}"
        now = self._loop.now_s
        self._publishing = False
        self._publish_times.append(now)
        for cell, role in enumerate(self._cell_role):
            if role is Role.TRAINING and cell != self._restoring:
                self._cell_available_s[cell] = now
        self._feed(WeightsPublished(now, version))
        self._pump()

    def _on_tick(self, _: int) -> None:
        self._feed(Tick(self._loop.now_s))

    def _on_cell_ready(self, cell: int) -> None:
        self._cell_ready_scheduled[cell] = False
        self._pump()

    # --- training side ------------------------------------------------------------------------

    def _pump(self) -> None:
        """Let the packer pull, idle training cells claim, and a finished batch go to its step."""
        packer = self._packer
        if packer.step is None or self._reducing:
            return
        now = self._loop.now_s
        step = packer.step
        training = [c for c, r in enumerate(self._cell_role) if r is Role.TRAINING]
        low_water = 2 * len(training) + 1
        while True:
            self._pull(step, low_water)
            claimed = False
            for cell in training:
                if self._cell_busy[cell]:
                    continue
                if self._cell_available_s[cell] > now:
                    self._wake_later(cell)
                    continue
                item = packer.claim()
                if item is None:
                    break
                tokens, g = item
                self._cell_items[cell].append(item)
                self._cell_in_flight[cell] = item
                self._cell_busy[cell] = True
                self._usage.set(cell, TRAINING_BUSY, now)
                done_s = now + self._training.seconds(tokens, self.layout.cell_nodes)
                self._cell_timer[cell] = self._loop.at(done_s, MICRO_DONE, cell)
                self._feed(MicroStepClaimed(now, cell, step, (self._group_name[g],)))
                claimed = True
            if not claimed:
                break
        if packer.complete and self.policy.state.restore_from is None:
            self._reducing = True
            self._reducer = self.policy.state.core
            self._step_timer = self._loop.at(now + self._training.step_overhead_s, STEP_DONE, step + 1)

    def _pull(self, step: int, low_water: int) -> None:
        packer = self._packer
        was_closed = packer.closed
        now = self._loop.now_s
        for g in packer.pull(self._group_tokens, low_water):
            self._feed(GroupPacked(now, self._group_name[g], step))
        if packer.closed and not was_closed:
            self._feed(BatchStreamClosed(now, step, packer.packed))

    def _wake_later(self, cell: int) -> None:
        available = self._cell_available_s[cell]
        if not self._cell_ready_scheduled[cell] and available < math.inf:
            self._cell_ready_scheduled[cell] = True
            self._loop.at(available, CELL_READY, cell)

    # --- result -------------------------------------------------------------------------------

    def _result(self, wall_s: float) -> SimResult:
        now = self._loop.now_s
        usage = self._usage
        usage.close(now)
        cell_time = sum(usage.area_s) or 1.0
        training_time = usage.area_s[TRAINING_IDLE] + usage.area_s[TRAINING_BUSY]
        timeline = usage.timeline(self._series, list(self._step_end_s), self._publish_times)
        s = self.policy.state
        return SimResult(
            preset=self.preset.name,
            layout=self.layout.describe(),
            mode=self.layout.mode.value,
            phi=self.layout.phi,
            mu=self.layout.mu,
            streaming=self.layout.streaming,
            seed=self._seed,
            steps=self._steps,
            total_s=now,
            step_end_s=list(self._step_end_s),
            staleness=[
                r for r in s.staleness if r.train_version < self._steps
            ],  # not the next, untrained batch
            expected_staleness=self.params.expected_staleness,
            rollout_utilization=self._running_area / self._capacity_area if self._capacity_area else 0.0,
            training_utilization=usage.area_s[TRAINING_BUSY] / training_time if training_time else 0.0,
            cell_time_share={name: usage.area_s[i] / cell_time for i, name in enumerate(CELL_STATE_NAMES)},
            executions_dispatched=s.dispatched,
            executions_started=self._started,
            executions_finished=self._finished,
            transitions=self._transitions,
            reroutes=self._reroutes,
            num_events=self._num_events,
            wall_s=wall_s,
            timeline=timeline,
            pool=self._pool_figures(),
        )


def _ignore(action: Action) -> None:
    """EndBurst needs no simulated work: the step and publication events carry the timing."""
