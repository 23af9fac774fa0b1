"""Config section of the scheduler: run shape (K, N, B), dispatch (φ, μ) and the elastic policy.

The policy itself takes a plain frozen record built from this section:
`services.scheduler.params.policy_params(config.scheduler)`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gyre.config.base import AtLeastOne, NonNegativeFloat, NonNegativeInt, Port, PositiveFloat, Section


class MismatchGateSection(Section):
    """What the scheduler does when the train/inference mismatch stays high (services/scheduler/mismatch_gate.py)."""

    action: Literal["off", "warn", "stop"] = "warn"
    """`warn` logs, `stop` ends the run like `max_steps` (reason in `SchedulerState.stop_reason` and the
    demo's `summary.json`), `off` ignores it."""
    max_kl: PositiveFloat = 0.015
    """Bound of a step's `mismatch_kl` (mean k3 per target sampled at the trainer's own version)."""
    num_steps: AtLeastOne = 3
    """Consecutive measured steps over `max_kl` before the gate acts."""


class SchedulerSection(Section):
    port: Port = 0
    """gRPC port; 0 picks a free one."""
    max_steps: int = 0
    """Stop after this many optimizer steps (no more dispatch or batches); 0 = run until shut down."""
    mismatch_gate: MismatchGateSection = Field(default_factory=MismatchGateSection)
    """Warn about or stop a run whose train/inference mismatch stays above a bound."""
    profile: str | None = None
    """Harness profile the proxy classifies this run's requests with (generic, claude_code, codex);
    unset = the runner's harness when it has a profile of that name (claude_code, codex), else generic."""
    seed: int = 0
    """Seed of query selection."""
    tick_s: float = 0.5
    """Period of the clock tick that re-evaluates the policy's timers."""
    peer_retry_s: NonNegativeFloat = 300.0
    """How long a call to another service (cell agent, proxy, packer) is retried while that service is
    unreachable or restarting, before the scheduler gives up and exits (to be restarted itself)."""
    mode: Literal["elastic", "async", "colocate"] = "elastic"
    """Scheduling mode; the three share one code path with different parameters."""
    num_cells: AtLeastOne = 3
    """K: elastic cells (cell 0 is the core)."""
    group_size: AtLeastOne = 8
    """N: executions per group."""
    batch_groups: AtLeastOne = 4
    """B: groups per optimizer step."""
    phi: NonNegativeFloat = 0.5
    """φ: extra dispatch in units of B at burst start (φ·B must be a whole number of groups)."""
    mu: AtLeastOne = 2
    """μ: optimizer steps per burst (between two weight publications)."""
    rho_min: float = 0.5
    """ρ_min: fraction of B that must be ready and unclaimed before a cell joins training."""
    tau_s: NonNegativeFloat = 2.0
    """τ: seconds the supply check must hold without interruption."""
    cell_capacity: AtLeastOne = 16
    """C_e: concurrent executions one cell serves in rollout."""
    separate_pool_capacity: NonNegativeInt = 0
    """C_s: concurrent executions of the separate rollout pool (0 = none)."""
    async_training_cells: AtLeastOne = 1
    """T: cells fixed in training in `async` mode (cells 0..T-1)."""
    streaming: bool = True
    """Streaming training: cells claim micro-steps as groups become ready."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tasks" in data:
            raise ValueError(
                "scheduler.tasks moved to tasks.queries (the `tasks:` section); move the list there"
            )
        return data

    @field_validator("rho_min")
    @classmethod
    def _rho(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError(f"rho_min must be in (0, 1]; got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> SchedulerSection:
        extra = self.phi * self.batch_groups
        if not math.isclose(extra, round(extra), abs_tol=1e-9):
            raise ValueError(
                f"phi * batch_groups must be a whole number of groups; got {self.phi} * {self.batch_groups}:"
                f" pick phi as a multiple of 1/{self.batch_groups}"
            )
        if self.mode == "async":
            if self.async_training_cells > self.num_cells:
                raise ValueError(
                    f"async_training_cells ({self.async_training_cells}) must not exceed num_cells ({self.num_cells})"
                )
            if self.async_training_cells == self.num_cells and self.separate_pool_capacity == 0:
                raise ValueError(
                    "async mode with every cell training needs a separate pool: "
                    "lower async_training_cells or set separate_pool_capacity > 0"
                )
        return self
