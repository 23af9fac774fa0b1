"""The simulator's side of a changing pool: it plays the cluster manager and the cells' lifecycle.

Pool events come from the scenario's schedule (`sim/pool.py`) and reach the policy as CellJoined,
CellLeaving and CellLost; the policy's answers are executed here: LoadWeights (the new cell is ready
after `cell_start_s`), RemoveCell, ReleaseMicroSteps (the cell's micro-steps of the open batch go back
to the packer's queue), RestoreCore (the new core loads the state and replays the lost steps at its own
training speed), plus the core's checkpoints (durable `checkpoint_s` after each step) and, for a static
baseline, the stop-the-world restart after a lost cell (`restart_s`).

`Simulation` (simulation.py) mixes this in; it owns the attributes declared below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gyre.metrics.timeline import RETURNING, ROLLOUT, TRAINING_IDLE
from services.scheduler.policy import (
    CellJoined,
    CellLeaving,
    CellLost,
    CellReady,
    CheckpointWritten,
    CoreRestored,
    Event,
    LoadWeights,
    Mode,
    Policy,
    PolicyParams,
    ReleaseMicroSteps,
    RemoveCell,
    RestoreCore,
    Role,
)
from sim.layout import Layout
from sim.loop import (
    CELL_LOADED,
    CORE_RESTORED,
    EXEC_END,
    EventLoop,
)
from sim.metrics import PoolFigures, PoolUsage
from sim.packer import SimPacker
from sim.pool import JOIN, LEAVE, NOTICE_END, POOLS, PoolScenario, PoolSchedule
from sim.training import TrainingModel

_STALL_S = 7 * 24 * 3600.0
"""With nothing but pool events left for this long, the run is stalled."""
NO_STEP_S = 30 * 24 * 3600.0
"""With no optimizer step for this long, the run is stalled (a livelock: events, no progress)."""


class SimulationStalled(RuntimeError):
    """The run cannot reach its step count: no event is left, only pool events for a week, or no step for
    30 simulated days (a policy or model bug, or a scenario that never lets the run progress)."""


class PoolMembership:
    """The pool's part of `Simulation`: the scenario's events, and the policy's actions about cells."""

    params: PolicyParams
    policy: Policy
    _loop: EventLoop
    _packer: SimPacker
    _training: TrainingModel
    _usage: PoolUsage
    _scenario: PoolScenario
    _schedule: PoolSchedule
    _figures: PoolFigures
    _cell_nodes: int
    _cell_role: list[Role]
    _cell_busy: list[bool]
    _cell_available_s: list[float]
    _cell_ready_scheduled: list[bool]
    _cell_items: list[list[tuple[float, int]]]
    """Micro-steps each cell claimed in the open batch (done or in flight): its share of the gradient."""
    _cell_in_flight: list[tuple[float, int] | None]
    _cell_loading: dict[int, tuple[int, int]]
    """Joining cell → (version it loads, loads so far)."""
    _leaving: set[int]
    _present_cells: int
    _node_area: float
    """∫ (nodes in the pool) dt so far, node-seconds."""
    _exec_end: dict[int, tuple[float, int]]
    """When each running execution ends, and the timer of that event."""
    _cell_timer: list[int]
    """The timer of each cell's micro-step in flight."""
    _step_timer: int
    _runner_free_s: float
    _num_events: int
    _step_end_s: list[float]
    _stalled_at_s: float
    """Without a step by then, the run is stalled."""
    _reducing: bool
    _reducer: int | None
    """The core that reduces the open batch's gradients (while `_reducing`)."""
    _publishing: bool
    _publisher: int | None
    _publications_in_flight: dict[int, int]
    """Timer → version of each publication on its way."""
    _restoring: int | None
    _restore_version: int
    _step_tokens: list[float]
    _checkpoint_writer: dict[int, int | None]

    def _init_pool(self, layout: Layout, seed: int, pool: PoolScenario | None) -> None:
        self._scenario = pool if pool is not None else POOLS["fixed"]
        self._schedule = PoolSchedule(
            self._scenario, num_cells=layout.num_cells, cell_nodes=layout.cell_nodes, seed=seed
        )
        self._figures = PoolFigures(scenario=self._scenario.name)
        self._cell_nodes = layout.cell_nodes
        self._cell_items = [[] for _ in range(layout.num_cells)]
        self._cell_in_flight = [None] * layout.num_cells
        self._cell_loading = {}
        self._leaving = set()
        self._present_cells = layout.num_cells
        self._node_area = 0.0
        self._exec_end = {}
        self._cell_timer = [0] * layout.num_cells
        self._step_timer = 0
        self._reducer = None
        self._publisher = None
        self._publications_in_flight = {}
        self._restoring = None
        self._restore_version = 0
        self._step_tokens = []
        self._checkpoint_writer = {}
        self._stalled_at_s = NO_STEP_S

    def _pool_figures(self) -> PoolFigures:
        figures = self._figures
        figures.capacity_node_h = self._node_area / 3600.0
        figures.steps_lost = self.policy.state.steps_lost
        return figures

    def _feed(self, event: Event) -> None:
        raise NotImplementedError

    def _pump(self) -> None:
        raise NotImplementedError

    def _sample_series(self, now_s: float) -> None:
        raise NotImplementedError

    def _advance(self, now_s: float) -> None:
        raise NotImplementedError

    def _pool_actions(self) -> dict[type[Any], Callable[[Any], None]]:
        return {
            LoadWeights: self._load_weights,
            ReleaseMicroSteps: self._release_microsteps,
            RemoveCell: self._remove_cell,
            RestoreCore: self._restore_core,
        }

    # --- the scenario's events ----------------------------------------------------------------

    def _pool_turn(self, idle_since_s: float | None, *, idle: bool) -> float | None:
        """The scenario's next event happens now (it comes before anything in the heap). `idle`: nothing
        is in the heap; returns since when that is so (None: not idle), and raises when the run stalled."""
        time_s, kind, value = self._schedule.pop()
        if not idle:
            idle_since_s = None
        elif idle_since_s is None:
            idle_since_s = self._loop.now_s
        if idle_since_s is not None and time_s - idle_since_s > _STALL_S:
            raise SimulationStalled(f"only pool events left since {idle_since_s:.0f} s")
        if time_s > self._stalled_at_s:
            self._check_progress(time_s)
        self._advance(time_s)
        self._loop.advance(time_s)
        self._on_pool_event(kind, value)
        self._num_events += 1
        self._sample_series(time_s)
        return idle_since_s

    def _check_progress(self, now_s: float) -> None:
        last_step_s = self._step_end_s[-1] if self._step_end_s else 0.0
        if now_s - last_step_s > NO_STEP_S:
            raise SimulationStalled(f"no step since {last_step_s:.0f} s: {self.policy.snapshot()}")

    def _on_pool_event(self, kind: int, value: float) -> None:
        now, scenario = self._loop.now_s, self._scenario
        if kind == JOIN:
            self._join(now)
            return
        if kind == NOTICE_END:
            cell = int(value)
            if self._cell_role[cell] is not Role.GONE:  # the notice ran out first: lost
                self._lose(cell, now)
            return
        present = [c for c, r in enumerate(self._cell_role) if r is not Role.GONE]
        candidates = [c for c in present if c not in self._leaving]
        if len(present) - len(self._leaving) <= scenario.min_cells or not candidates:
            return
        cell = candidates[int(value * len(candidates))]
        if kind == LEAVE:
            self._leaving.add(cell)
            self._schedule.plan(now + scenario.notice_s, NOTICE_END, cell)
            if scenario.return_after_h is not None:
                self._schedule.plan(now + scenario.return_after_h * 3600.0, JOIN)
            self._feed(CellLeaving(now, cell))
        else:
            if scenario.replace_after_h is not None:
                self._schedule.plan(now + scenario.replace_after_h * 3600.0, JOIN)
            self._lose(cell, now)

    def _join(self, now: float) -> None:
        cell = self._usage.add(RETURNING, now)  # loading weights, drawn like a cell on its way back
        self._cell_role.append(Role.JOINING)
        self._cell_busy.append(False)
        self._cell_available_s.append(0.0)
        self._cell_ready_scheduled.append(False)
        self._cell_items.append([])
        self._cell_in_flight.append(None)
        self._cell_timer.append(0)
        self._present_cells += 1
        self._figures.cells_joined += 1
        self._feed(CellJoined(now, cell))

    def _lose(self, cell: int, now: float) -> None:
        self._feed(CellLost(now, cell))
        if self.params.mode is not Mode.ELASTIC and self._scenario.restart_s > 0:
            self._restart(now)

    def _restart(self, now: float) -> None:
        """A static baseline lost a cell: the whole job restarts (see PoolScenario.restart_s)."""
        pause_s = self._scenario.restart_s
        self._figures.restarts += 1
        self._loop.delay_all(pause_s)
        self._runner_free_s = max(self._runner_free_s, now) + pause_s
        self._exec_end = {e: (end_s + pause_s, timer) for e, (end_s, timer) in self._exec_end.items()}
        self._recompute(list(self._exec_end))
        for cell, role in enumerate(self._cell_role):
            if role is Role.TRAINING:
                self._cell_available_s[cell] = max(self._cell_available_s[cell], now) + pause_s
            in_flight = self._cell_in_flight[cell]
            done = [item for item in self._cell_items[cell] if item is not in_flight]
            self._packer.requeue(done)  # their gradients were lost with the trainers
            self._cell_items[cell] = [] if in_flight is None else [in_flight]
        self._cancel_reduction()

    def _cancel_reduction(self) -> None:
        """A gradient the reduction waited for was lost: the step completes after it is recomputed."""
        if self._reducing:
            self._reducing = False
            self._loop.cancel(self._step_timer)

    def _recompute(self, executions: list[int]) -> None:
        """These executions lost their engine: each recomputes its prefix on its new one."""
        for e in executions:
            if e in self._exec_end:  # (started: its ExecutionStarted came)
                self._delay_execution(e, self._scenario.recompute_s)
                self._figures.recomputed_executions += 1

    def _delay_execution(self, e: int, delay_s: float) -> None:
        end_s, timer = self._exec_end[e]
        self._loop.cancel(timer)
        self._exec_end[e] = (end_s + delay_s, self._loop.at(end_s + delay_s, EXEC_END, e))

    # --- the policy's actions -----------------------------------------------------------------

    def _load_weights(self, a: LoadWeights) -> None:
        _, loads = self._cell_loading.get(a.cell, (a.version, 0))
        self._cell_loading[a.cell] = (a.version, loads + 1)
        load_s = self._scenario.cell_start_s if loads == 0 else self._training.publish_s
        self._loop.at(self._loop.now_s + load_s, CELL_LOADED, a.cell)

    def _on_cell_loaded(self, cell: int) -> None:
        if self._cell_role[cell] is Role.GONE:
            return
        now = self._loop.now_s
        self._feed(CellReady(now, cell, self._cell_loading[cell][0]))
        if self._cell_role[cell] is Role.JOINING and self.policy.state.roles[cell] is Role.ROLLOUT:
            self._cell_role[cell] = Role.ROLLOUT
            self._usage.set(cell, ROLLOUT, now)

    def _release_microsteps(self, a: ReleaseMicroSteps) -> None:
        cell = a.cell
        in_flight = self._cell_in_flight[cell]
        if in_flight is not None:
            self._cell_in_flight[cell] = None
            self._cell_busy[cell] = False
            self._loop.cancel(self._cell_timer[cell])
            self._packer.in_flight -= 1
            self._usage.set(cell, TRAINING_IDLE, self._loop.now_s)
        self._packer.requeue(self._cell_items[cell])
        self._cell_items[cell] = []
        self._cancel_reduction()

    def _remove_cell(self, a: RemoveCell) -> None:
        cell, now = a.cell, self._loop.now_s
        self._cell_role[cell] = Role.GONE
        self._usage.remove(cell, now)
        self._present_cells -= 1
        self._leaving.discard(cell)
        if a.lost:
            self._figures.cells_lost += 1
        else:
            self._figures.cells_left += 1
        if cell == self._publisher and self._publications_in_flight:  # lost with it: its successor publishes
            for timer in self._publications_in_flight:
                self._loop.cancel(timer)
            self._publications_in_flight = {}
            self._publishing = False
        if cell == self._restoring:
            self._restoring = None
        if cell == self._reducer:  # the reduction died with it: after the restore
            self._cancel_reduction()

    def _restore_core(self, a: RestoreCore) -> None:
        t = self._training
        replay_s = sum(
            self._step_tokens[v] / (self._cell_nodes * t.node_tokens_per_s) + t.step_overhead_s
            for v in range(a.from_version, a.version)
        )
        self._figures.core_restores += 1
        self._restoring = a.cell
        self._restore_version = a.version
        self._cell_available_s[a.cell] = math.inf
        self._loop.at(self._loop.now_s + self._scenario.restore_s + replay_s, CORE_RESTORED, a.cell)

    def _on_core_restored(self, cell: int) -> None:
        if self._restoring != cell:  # it was lost while restoring
            return
        now = self._loop.now_s
        self._restoring = None
        self._cell_available_s[cell] = now
        self._feed(CoreRestored(now, cell, self._restore_version))
        self._pump()

    def _on_checkpoint(self, version: int) -> None:
        writer = self._checkpoint_writer.pop(version, None)
        if writer is not None and self._cell_role[writer] is not Role.GONE:
            self._feed(CheckpointWritten(self._loop.now_s, version))
