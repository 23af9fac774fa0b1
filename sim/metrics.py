"""What a simulation measures: time-weighted usage, the role timeline, per-step times, staleness.

Usage is integrated exactly between events: every quantity is piecewise constant, so each event adds
value × elapsed time. The role timeline (cells × time, one state per segment) is kept only when asked
for (`record_timeline`), since a 200-step run would hold hundreds of thousands of segments.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from services.scheduler.policy import StalenessRecord, mean_staleness

ROLLOUT, DRAINING, TRAINING_IDLE, TRAINING_BUSY, RETURNING = range(5)
CELL_STATE_NAMES = ("rollout", "draining", "training_idle", "training_busy", "returning")


class CellUsage:
    """Each cell's state over time: counts per state, cell-seconds per state, optional segments."""

    __slots__ = ("_since", "area_s", "counts", "segments", "states")

    def __init__(self, num_cells: int, *, record: bool) -> None:
        self.states = [ROLLOUT] * num_cells
        self.counts = [0] * len(CELL_STATE_NAMES)
        self.counts[ROLLOUT] = num_cells
        self.area_s = [0.0] * len(CELL_STATE_NAMES)
        self._since = [0.0] * num_cells
        self.segments: list[tuple[int, float, float, int]] | None = [] if record else None
        """(cell, start_s, end_s, state) when recording."""

    def advance(self, dt: float) -> None:
        for state, n in enumerate(self.counts):
            if n:
                self.area_s[state] += n * dt

    def set(self, cell: int, state: int, now_s: float) -> None:
        old = self.states[cell]
        if old == state:
            return
        self.counts[old] -= 1
        self.counts[state] += 1
        self.states[cell] = state
        if self.segments is not None and now_s > self._since[cell]:
            self.segments.append((cell, self._since[cell], now_s, old))
        self._since[cell] = now_s

    def close(self, now_s: float) -> None:
        if self.segments is not None:
            for cell, state in enumerate(self.states):
                if now_s > self._since[cell]:
                    self.segments.append((cell, self._since[cell], now_s, state))
                self._since[cell] = now_s


@dataclass(slots=True)
class Timeline:
    """Everything the role-timeline plot draws."""

    num_cells: int
    segments: list[tuple[int, float, float, int]]
    series: list[tuple[float, int, int, int]]
    """(time_s, waterlevel, rollout capacity, running executions) after each event."""
    step_end_s: list[float]
    publish_s: list[float]
    title: str = ""
    time_unit: tuple[str, float] = ("hours", 3600.0)
    """(name, seconds per unit) of the x axis: hours for simulated clusters, seconds for the demo."""


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
        ]
