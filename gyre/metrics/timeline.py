"""The role timeline of K cells: each cell's state over time (rollout, draining, training idle or busy,
returning), integrated exactly between events, and its picture: cells × time colored by role (like the
paper's Figure 2) over the waterlevel, the rollout capacity and the running executions.

The simulator records one for a simulated cluster (`gyre sim run --plot runs/e0.png`) and the demo's report
for a live run (`runs/<run>/timeline.png`), so both draw the same picture from the same record. The plot
uses matplotlib's Agg canvas directly (no pyplot, no display, no global state), imported when a plot is
drawn: recording a timeline costs no matplotlib import.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

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


_COLORS = {
    "rollout": "#4C72B0",
    "draining": "#DD8452",
    "training_idle": "#F4B6B6",
    "training_busy": "#C44E52",
    "returning": "#E5C35C",
}
_LABELS = {
    "rollout": "rollout",
    "draining": "rollout → training",
    "training_idle": "training (waiting for data)",
    "training_busy": "training (micro-step)",
    "returning": "training → rollout",
}


def plot_timeline(timeline: Timeline, path: Path) -> Path:
    """Write the PNG to `path` (parent directories are created) and return the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(13, 2.2 + 0.45 * timeline.num_cells + 2.4))
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 1, height_ratios=[0.45 * timeline.num_cells + 0.6, 2.4], hspace=0.12)
    ax = fig.add_subplot(grid[0])
    bottom = fig.add_subplot(grid[1], sharex=ax)

    unit_name, unit_s = timeline.time_unit
    bars: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for cell, start_s, end_s, state in timeline.segments:
        bars[(cell, state)].append((start_s / unit_s, (end_s - start_s) / unit_s))
    for (cell, state), spans in bars.items():
        ax.broken_barh(spans, (cell - 0.4, 0.8), facecolors=_COLORS[CELL_STATE_NAMES[state]], linewidth=0)
    ax.set_yticks(range(timeline.num_cells))
    ax.set_yticklabels([f"cell {c}" + (" (core)" if c == 0 else "") for c in range(timeline.num_cells)])
    ax.set_ylim(timeline.num_cells - 0.5, -0.5)
    for t in timeline.step_end_s:
        ax.axvline(t / unit_s, color="#555555", linewidth=0.6, alpha=0.6)
    for t in timeline.publish_s:
        ax.axvline(t / unit_s, color="black", linewidth=1.0, linestyle="--")
    ax.legend(
        handles=[Patch(color=_COLORS[n], label=_LABELS[n]) for n in CELL_STATE_NAMES],
        loc="upper center",
        bbox_to_anchor=(0.5, 1.0 + 1.2 / (0.45 * timeline.num_cells + 0.6)),
        ncol=5,
        frameon=False,
        fontsize=8,
    )
    ax.tick_params(labelbottom=False)
    if timeline.title:
        ax.set_title(timeline.title, fontsize=10, pad=28)

    hours = [t / unit_s for t, _, _, _ in timeline.series]
    bottom.step(
        hours,
        [w for _, w, _, _ in timeline.series],
        where="post",
        label="waterlevel w = d − f",
        color="black",
    )
    bottom.step(
        hours,
        [c for _, _, c, _ in timeline.series],
        where="post",
        label="rollout capacity C_R",
        color="#4C72B0",
    )
    bottom.step(
        hours, [r for _, _, _, r in timeline.series], where="post", label="running p − f", color="#55A868"
    )
    bottom.set_xlabel(f"{unit_name} (thin lines: optimizer steps; dashed: weight publications)")
    bottom.set_ylabel("executions")
    bottom.legend(loc="upper right", fontsize=8, frameon=False)
    bottom.set_ylim(bottom=0)

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
