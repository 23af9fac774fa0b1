"""The paper's Table 2 scheduling ablation, every row a `Layout` of the `nl2repo-122b` preset.

    gyre sim ablation --preset nl2repo-122b [--json]

Rows run the same policy code with different parameters, on the same workload draw (one seed), for
the table's 12 steps. `paper_total_h` and `paper_ratio_vs_e0` are the paper's reported numbers, shown
beside the simulated ones for comparison — nothing in the simulator is fitted to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.policy import Mode
from sim.layout import Layout
from sim.metrics import SimResult
from sim.presets import Preset
from sim.simulation import Simulation


@dataclass(frozen=True, slots=True)
class AblationRow:
    id: str
    evolution: str
    layout: Layout
    paper_total_h: float
    paper_ratio_vs_e0: float


def _row(
    id: str,
    evolution: str,
    mode: Mode,
    phi: float,
    mu: int,
    *,
    streaming: bool,
    cells: int,
    cell_nodes: int = 4,
    pool_nodes: int = 0,
    training_cells: int = 0,
    paper_total_h: float,
    paper_ratio: float,
) -> AblationRow:
    layout = Layout(
        mode,
        num_cells=cells,
        cell_nodes=cell_nodes,
        phi=phi,
        mu=mu,
        streaming=streaming,
        separate_pool_nodes=pool_nodes,
        async_training_cells=training_cells,
    )
    return AblationRow(id, evolution, layout, paper_total_h, paper_ratio)


TABLE2: tuple[AblationRow, ...] = (
    _row(
        "A0",
        "vanilla Async",
        Mode.ASYNC,
        1.5,
        1,
        streaming=False,
        cells=8,
        training_cells=4,
        paper_total_h=25.08,
        paper_ratio=1.556,
    ),
    _row(
        "A1",
        "A0 repartitioned",
        Mode.ASYNC,
        1.5,
        1,
        streaming=False,
        cells=8,
        training_cells=2,
        paper_total_h=27.01,
        paper_ratio=1.676,
    ),
    _row(
        "A2",
        "A0 + multi-step burst",
        Mode.ASYNC,
        0.5,
        3,
        streaming=False,
        cells=8,
        training_cells=4,
        paper_total_h=32.58,
        paper_ratio=2.021,
    ),
    _row(
        "A3",
        "A0 + streaming",
        Mode.ASYNC,
        1.5,
        1,
        streaming=True,
        cells=8,
        training_cells=4,
        paper_total_h=22.18,
        paper_ratio=1.376,
    ),
    _row(
        "C0",
        "vanilla Colocate",
        Mode.COLOCATE,
        0.0,
        4,
        streaming=False,
        cells=8,
        paper_total_h=23.23,
        paper_ratio=1.442,
    ),
    _row(
        "C1",
        "C0 + separate rollout nodes",
        Mode.COLOCATE,
        0.5,
        3,
        streaming=False,
        cells=7,
        pool_nodes=4,
        paper_total_h=22.56,
        paper_ratio=1.400,
    ),
    _row(
        "C2",
        "C1 + streaming",
        Mode.COLOCATE,
        0.5,
        3,
        streaming=True,
        cells=7,
        pool_nodes=4,
        paper_total_h=19.23,
        paper_ratio=1.193,
    ),
    _row(
        "C3",
        "C2 reallocated",
        Mode.COLOCATE,
        0.5,
        3,
        streaming=True,
        cells=4,
        pool_nodes=16,
        paper_total_h=20.69,
        paper_ratio=1.284,
    ),
    _row(
        "E0",
        "C2 + fine-grained elastic cells",
        Mode.ELASTIC,
        0.5,
        3,
        streaming=True,
        cells=8,
        paper_total_h=16.12,
        paper_ratio=1.000,
    ),
    _row(
        "E1",
        "E0 single-step burst",
        Mode.ELASTIC,
        1.5,
        1,
        streaming=True,
        cells=8,
        paper_total_h=17.87,
        paper_ratio=1.109,
    ),
    _row(
        "E2",
        "E0 with four 8-node cells",
        Mode.ELASTIC,
        0.5,
        3,
        streaming=True,
        cells=4,
        cell_nodes=8,
        paper_total_h=16.47,
        paper_ratio=1.022,
    ),
)
"""Table 2 of the paper (its Table 1): NL2RepoBench, Qwen 3.6 122B, E[d] = 1.5, 12 steps, 32 nodes."""


@dataclass(frozen=True, slots=True)
class AblationOutcome:
    row: AblationRow
    result: SimResult
    ratio_vs_e0: float


def run_ablation(preset: Preset, *, steps: int = 12, seed: int = 0) -> list[AblationOutcome]:
    """Simulate every row; ratios are totals over E0's total."""
    for row in TABLE2:
        if row.layout.num_nodes != preset.num_nodes:
            raise ValueError(
                f"row {row.id} uses {row.layout.num_nodes} nodes; preset {preset.name} has {preset.num_nodes}"
            )
    results = [(row, Simulation(preset, row.layout, steps=steps, seed=seed).run()) for row in TABLE2]
    e0 = next(r for row, r in results if row.id == "E0")
    return [AblationOutcome(row, r, r.total_s / e0.total_s) for row, r in results]
