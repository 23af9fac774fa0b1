"""What a simulation measures: time-weighted usage, per-step times, staleness, and the role timeline
(`gyre/metrics/timeline.py`, shared with the demo's report).

Usage is integrated exactly between events: every quantity is piecewise constant, so each event adds
value × elapsed time. The role timeline (cells × time, one state per segment) is kept only when asked
for (`record_timeline`), since a 200-step run would hold hundreds of thousands of segments.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from gyre.metrics.timeline import Timeline
from services.scheduler.policy import StalenessRecord, mean_staleness


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
