"""How a simulated cluster is organized and scheduled: mode, cells, separate pool, (φ, μ), streaming.

A preset fixes the hardware and the workload; a layout says how the same nodes are used, so every row
of the paper's Table 2 is one layout on the `nl2repo-122b` preset:

    Layout(Mode.ASYNC, num_cells=8, cell_nodes=4, phi=1.5, mu=1, streaming=False, async_training_cells=4)
    Layout(Mode.COLOCATE, num_cells=7, cell_nodes=4, phi=0.5, mu=3, separate_pool_nodes=4)
    Layout(Mode.ELASTIC, num_cells=8, cell_nodes=4, phi=0.5, mu=3)
"""

from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.policy import Mode, PolicyParams
from services.scheduler.policy.params import matched_phi_mu
from sim.presets import Preset

DEFAULT_TARGET_STALENESS = 1.5
"""E[d] the paper's Table 2 compares at; the per-mode defaults of (φ, μ) below all give it."""

DEFAULT_PHI_MU: dict[Mode, tuple[float, int]] = {
    mode: matched_phi_mu(mode, DEFAULT_TARGET_STALENESS, elastic_mu=3) for mode in Mode
}
"""E0 (0.5, 3), A0 (1.5, 1), C0 (0, 4) of the paper's Table 2."""


@dataclass(frozen=True, slots=True)
class Layout:
    mode: Mode
    num_cells: int
    cell_nodes: int
    phi: float
    mu: int
    streaming: bool = True
    separate_pool_nodes: int = 0
    async_training_cells: int = 0
    """T in `async` mode: cells 0..T-1 train for the whole run."""

    def __post_init__(self) -> None:
        if self.num_cells < 1 or self.cell_nodes < 1 or self.separate_pool_nodes < 0:
            raise ValueError("num_cells and cell_nodes must be >= 1, separate_pool_nodes >= 0")

    @property
    def num_nodes(self) -> int:
        return self.num_cells * self.cell_nodes + self.separate_pool_nodes

    @classmethod
    def default(
        cls,
        preset: Preset,
        mode: Mode,
        *,
        phi: float | None = None,
        mu: int | None = None,
        streaming: bool = True,
    ) -> Layout:
        """The preset's cells under `mode`; async splits them in half; (φ, μ) default to E[d] = 1.5."""
        default_phi, default_mu = DEFAULT_PHI_MU[mode]
        return cls(
            mode=mode,
            num_cells=preset.num_cells,
            cell_nodes=preset.cell_nodes,
            phi=default_phi if phi is None else phi,
            mu=default_mu if mu is None else mu,
            streaming=streaming,
            async_training_cells=preset.num_cells // 2 if mode is Mode.ASYNC else 0,
        )

    def policy_params(self, preset: Preset) -> PolicyParams:
        return PolicyParams(
            mode=self.mode,
            num_cells=self.num_cells,
            group_size=preset.group_size,
            batch_groups=preset.batch_groups,
            phi=self.phi,
            mu=self.mu,
            rho_min=preset.rho_min,
            tau_s=preset.tau_s,
            cell_capacity=self.cell_nodes * preset.executions_per_node,
            separate_pool_capacity=self.separate_pool_nodes * preset.executions_per_node,
            async_training_cells=max(1, self.async_training_cells),
            streaming=self.streaming,
        )

    def describe(self) -> str:
        """Allocation in the paper's notation (16 T / 16 R, 28 C / 4 S, 8 cells × 4)."""
        if self.mode is Mode.ASYNC:
            t = self.async_training_cells * self.cell_nodes
            return f"{t} T / {self.num_nodes - t} R"
        if self.mode is Mode.COLOCATE:
            return f"{self.num_cells * self.cell_nodes} C / {self.separate_pool_nodes} S"
        pool = f" + {self.separate_pool_nodes} S" if self.separate_pool_nodes else ""
        return f"{self.num_cells} cells x {self.cell_nodes}{pool}"
