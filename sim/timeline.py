"""Draw a simulation's role timeline as a PNG: cells × time colored by role (like the paper's Figure 2),
over the waterlevel, the rollout capacity and the running executions.

    gyre sim run --preset nl2repo-122b --mode elastic --steps 12 --plot runs/e0.png

Uses matplotlib's Agg canvas directly (no pyplot, no display, no global state).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim.metrics import CELL_STATE_NAMES, Timeline

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
