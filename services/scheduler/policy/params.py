"""Parameters of the scheduler policy: one frozen record, so the policy stays pure.

The scheduler service builds it from its config section (`services/scheduler/params.py`,
`policy_params(cfg.scheduler)`: the policy imports nothing of the project); the simulator and the tests
build it by hand. Every mode of docs/design.md "Control plane" is a set of values of this record, not
a code path:

    elastic   cells join training one by one under waterlevel control, return at burst end
    async     cells 0..T-1 train for the whole run, the rest roll out (the paper uses μ = 1, φ = E[d])
    colocate  all cells switch together (the paper uses φ = 0, μ = 2E[d] + 1)

`matched_phi_mu(mode, E[d], elastic_mu)` gives each mode's (φ, μ) at one target staleness, the rule
every comparison of the modes uses (`gyre demo --mode`, `gyre bench e2e`, the simulator's defaults).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Mode(StrEnum):
    ELASTIC = "elastic"
    ASYNC = "async"
    COLOCATE = "colocate"


def matched_phi_mu(mode: Mode, target_staleness: float, elastic_mu: int) -> tuple[float, int]:
    """(φ, μ) of `mode` whose steady-state staleness φ + (μ − 1)/2 is `target_staleness`.

    elastic (E[d] − (μ_e − 1)/2, μ_e), async (E[d], 1), colocate (0, 2·E[d] + 1): the paper's rule
    for comparing the modes at one staleness (Table 2 rows E0 (0.5, 3), A0 (1.5, 1), C0 (0, 4))."""
    if target_staleness < 0:
        raise ValueError(f"target staleness must be >= 0; got {target_staleness}")
    if mode is Mode.ELASTIC:
        phi = target_staleness - (elastic_mu - 1) / 2
        if phi < 0:
            raise ValueError(
                f"elastic μ={elastic_mu} overshoots target staleness {target_staleness:g}; lower μ"
            )
        return phi, elastic_mu
    if mode is Mode.ASYNC:
        return target_staleness, 1
    mu = 2 * target_staleness + 1
    if not math.isclose(mu, round(mu), abs_tol=1e-9):
        raise ValueError(
            f"colocate needs μ = 2·E[d] + 1 to be whole; target staleness {target_staleness:g} gives {mu:g}:"
            " pick E[d] as a multiple of 0.5"
        )
    return 0.0, round(mu)


@dataclass(frozen=True, slots=True)
class PolicyParams:
    mode: Mode = Mode.ELASTIC
    """Scheduling mode (see the module docstring)."""
    num_cells: int = 3
    """K: elastic cells; cell 0 is the core."""
    group_size: int = 8
    """N: executions per group."""
    batch_groups: int = 4
    """B: groups per optimizer step."""
    phi: float = 0.5
    """φ: extra dispatch at the first burst start, in units of B."""
    mu: int = 2
    """μ: optimizer steps per burst (between two weight publications)."""
    rho_min: float = 0.5
    """ρ_min: claimable groups, as a fraction of B, that the supply check requires."""
    tau_s: float = 2.0
    """τ: seconds the supply check must hold without interruption before a cell joins training."""
    cell_capacity: int = 16
    """C_e: concurrent executions one cell serves in rollout."""
    separate_pool_capacity: int = 0
    """C_s: concurrent executions of the separate rollout pool (0 = no pool)."""
    async_training_cells: int = 1
    """T: cells 0..T-1 that train for the whole run in `async` mode."""
    streaming: bool = True
    """Streaming training: groups are claimable as soon as they are ready, not only as a full batch."""

    def __post_init__(self) -> None:
        for name in ("num_cells", "group_size", "batch_groups", "mu", "cell_capacity"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}")
        if self.phi < 0:
            raise ValueError(f"phi must be >= 0; got {self.phi}")
        if not 0 < self.rho_min <= 1:
            raise ValueError(f"rho_min must be in (0, 1]; got {self.rho_min}")
        if self.tau_s < 0:
            raise ValueError(f"tau_s must be >= 0; got {self.tau_s}")
        if self.separate_pool_capacity < 0:
            raise ValueError(f"separate_pool_capacity must be >= 0; got {self.separate_pool_capacity}")
        extra = self.phi * self.batch_groups
        if not math.isclose(extra, round(extra), abs_tol=1e-9):
            raise ValueError(
                f"phi * batch_groups must be a whole number of groups; got {self.phi} * {self.batch_groups}"
                f" = {extra:g}: pick phi as a multiple of 1/{self.batch_groups}"
            )
        if self.mode is Mode.ASYNC:
            t = self.async_training_cells
            if not 1 <= t <= self.num_cells:
                raise ValueError(f"async_training_cells must be in [1, num_cells={self.num_cells}]; got {t}")
            if t == self.num_cells and self.separate_pool_capacity == 0:
                raise ValueError(
                    "async mode with every cell training needs a separate pool: "
                    "lower async_training_cells or set separate_pool_capacity > 0"
                )

    @property
    def initial_dispatch_groups(self) -> int:
        """Groups dispatched at the first burst start: (φ + μ)·B."""
        return round(self.phi * self.batch_groups) + self.mu * self.batch_groups

    @property
    def burst_dispatch_groups(self) -> int:
        """Groups dispatched after every weight publication: μ·B."""
        return self.mu * self.batch_groups

    @property
    def expected_staleness(self) -> float:
        """Steady-state mean staleness under boundary dispatch: φ + (μ − 1)/2."""
        return self.phi + (self.mu - 1) / 2

    @property
    def supply_threshold(self) -> float:
        """ρ_min·B: claimable groups the supply check requires."""
        return self.rho_min * self.batch_groups

    @property
    def transition_unit(self) -> int:
        """Cells that change role together: one in `elastic`, all K in `colocate` (0 in `async`)."""
        if self.mode is Mode.ELASTIC:
            return 1
        if self.mode is Mode.COLOCATE:
            return self.num_cells
        return 0
