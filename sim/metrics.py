"""What a simulation measures: time-weighted usage, per-step times, staleness, and the role timeline
(`gyre/metrics/timeline.py`, shared with the demo's report).

Usage is integrated exactly between events: every quantity is piecewise constant, so each event adds
value × elapsed time. The role timeline (cells × time, one state per segment) is kept only when asked
for (`record_timeline`), since a 200-step run would hold hundreds of thousands of segments. In a pool
that changes, a cell counts only while it is in the pool (`PoolUsage`), and the pool's size is
integrated too: capacity-hours, the node-hours the run held, whatever they did.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from gyre.metrics.timeline import CellUsage, Timeline
from services.scheduler.policy import StalenessRecord, mean_staleness

ABSENT = -1
"""A cell's state before it joined the pool and after it left it: no time, no timeline segment."""


class PoolUsage(CellUsage):
    """`CellUsage` for a pool whose cells come and go: cells are added, and a removed cell stops counting."""

    __slots__ = ()

    def add(self, state: int, now_s: float) -> int:
        """A new cell, in `state` from `now_s`; returns its index."""
        self.states.append(state)
        self.counts[state] += 1
        self._since.append(now_s)
        return len(self.states) - 1

    def remove(self, cell: int, now_s: float) -> None:
        old = self.states[cell]
        if old == ABSENT:
            return
        self.counts[old] -= 1
        if self.segments is not None and now_s > self._since[cell]:
            self.segments.append((cell, self._since[cell], now_s, old))
        self.states[cell] = ABSENT
        self._since[cell] = now_s

    def set(self, cell: int, state: int, now_s: float) -> None:
        if self.states[cell] != ABSENT:
            super().set(cell, state, now_s)

    def close(self, now_s: float) -> None:
        if self.segments is not None:
            for cell, state in enumerate(self.states):
                if state != ABSENT and now_s > self._since[cell]:
                    self.segments.append((cell, self._since[cell], now_s, state))
                self._since[cell] = now_s

    def timeline(
        self, series: list[tuple[float, int, int, int]], step_end_s: list[float], publish_s: list[float]
    ) -> Timeline | None:
        """The role timeline of every cell that was ever in the pool (None when not recorded)."""
        if self.segments is None:
            return None
        return Timeline(
            num_cells=len(self.states),
            segments=self.segments,
            series=series,
            step_end_s=step_end_s,
            publish_s=publish_s,
        )


@dataclass(slots=True)
class PoolFigures:
    """What a changing pool did to a run (all zero on a fixed pool but the capacity)."""

    scenario: str = "fixed"
    capacity_node_h: float = 0.0
    """∫ (nodes in the pool) dt over the run: cells count from joining until they are gone."""
    cells_joined: int = 0
    cells_left: int = 0
    cells_lost: int = 0
    steps_lost: int = 0
    """Steps lost cores had taken past their newest checkpoint (their successors took them again)."""
    core_restores: int = 0
    restarts: int = 0
    """Stop-the-world restarts of a static baseline after a lost cell."""
    recomputed_executions: int = 0
    """Executions rerouted from a lost cell (or restarted engines) that recomputed their prefix."""

    def to_json(self, steps: int, total_s: float) -> dict[str, Any]:
        hours = total_s / 3600.0
        return {
            "scenario": self.scenario,
            "capacity_node_h": round(self.capacity_node_h, 2),
            "mean_pool_nodes": round(self.capacity_node_h / hours, 3) if hours else 0.0,
            "steps_per_1k_node_h": round(1000.0 * steps / self.capacity_node_h, 4)
            if self.capacity_node_h
            else 0.0,
            "cells_joined": self.cells_joined,
            "cells_left": self.cells_left,
            "cells_lost": self.cells_lost,
            "steps_lost": self.steps_lost,
            "core_restores": self.core_restores,
            "restarts": self.restarts,
            "recomputed_executions": self.recomputed_executions,
        }


@dataclass(slots=True)
class SimResult:
    preset: str
    layout: str
    mode: str
    phi: float
    mu: int
    streaming: bool
    seed: int
    steps: int
    total_s: float
    step_end_s: list[float]
    staleness: list[StalenessRecord]
    expected_staleness: float
    rollout_utilization: float
    training_utilization: float
    cell_time_share: dict[str, float]
    executions_dispatched: int
    executions_started: int
    executions_finished: int
    transitions: int
    reroutes: int
    num_events: int
    wall_s: float = 0.0
    timeline: Timeline | None = field(default=None, repr=False)
    pool: PoolFigures = field(default_factory=PoolFigures)

    @property
    def total_h(self) -> float:
        return self.total_s / 3600.0

    @property
    def step_times_h(self) -> list[float]:
        ends = [0.0, *self.step_end_s]
        return [(b - a) / 3600.0 for a, b in itertools.pairwise(ends)]

    def mean_staleness(self, *, from_step: int = 0) -> float | None:
        return mean_staleness(self.staleness, from_step=from_step)

    def to_json(self) -> dict[str, Any]:
        after = self.mean_staleness(from_step=self.mu)
        return {
            "preset": self.preset,
            "mode": self.mode,
            "layout": self.layout,
            "phi": self.phi,
            "mu": self.mu,
            "streaming": self.streaming,
            "seed": self.seed,
            "steps": self.steps,
            "total_h": round(self.total_h, 4),
            "step_times_h": [round(t, 4) for t in self.step_times_h],
            "mean_staleness_after_first_burst": None if after is None else round(after, 4),
            "mean_staleness_all_steps": round(self.mean_staleness() or 0.0, 4),
            "expected_staleness": self.expected_staleness,
            "rollout_utilization": round(self.rollout_utilization, 4),
            "training_utilization": round(self.training_utilization, 4),
            "cell_time_share": {k: round(v, 4) for k, v in self.cell_time_share.items()},
            "executions_dispatched": self.executions_dispatched,
            "executions_started": self.executions_started,
            "executions_simulated": self.executions_finished,
            "transitions": self.transitions,
            "reroutes": self.reroutes,
            "events": self.num_events,
            "wall_s": round(self.wall_s, 3),
            "pool": self.pool.to_json(self.steps, self.total_s),
        }

    def text_lines(self, title: str) -> list[str]:
        """`gyre sim run`'s report without --json: `title` (what ran), then one line per figure."""
        after = self.mean_staleness(from_step=self.mu)
        shown = round(after, 4) if after is not None else None
        return [
            title,
            f"total                {self.total_h:.2f} h for {self.steps} steps",
            "per step (h)         "
            + " ".join(f"{t:.2f}" for t in self.step_times_h[:48])
            + (" ..." if self.steps > 48 else ""),
            f"mean staleness       {shown} after the first burst, "
            f"{round(self.mean_staleness() or 0.0, 4)} over all steps (φ + (μ−1)/2 = {self.expected_staleness:g})",
            f"utilization          rollout {self.rollout_utilization:.1%}, training {self.training_utilization:.1%}",
            "cell time            " + ", ".join(f"{k} {v:.1%}" for k, v in self.cell_time_share.items()),
            f"executions           {self.executions_finished} simulated ({self.executions_started} started),"
            f" {self.transitions} transitions, {self.reroutes} reroutes, wall {self.wall_s:.2f} s",
            f"pool                 {self.pool.scenario}: {self.pool.capacity_node_h:.0f} node-hours; cells joined"
            f" {self.pool.cells_joined}, left {self.pool.cells_left}, lost {self.pool.cells_lost};"
            f" steps lost {self.pool.steps_lost}, restarts {self.pool.restarts}",
        ]
