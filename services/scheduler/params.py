"""The policy's parameters from the scheduler's config section: the shell builds them, so the pure policy
(services/scheduler/policy/) imports nothing of the project, not even the config it is built from.

    params = policy_params(config.scheduler)
"""

from __future__ import annotations

from gyre.config.scheduler import SchedulerSection
from services.scheduler.policy import Mode, PolicyParams


def policy_params(section: SchedulerSection) -> PolicyParams:
    """The policy's view of the scheduler config section (every knob, copied)."""
    return PolicyParams(
        mode=Mode(section.mode),
        num_cells=section.num_cells,
        group_size=section.group_size,
        batch_groups=section.batch_groups,
        phi=section.phi,
        mu=section.mu,
        rho_min=section.rho_min,
        tau_s=section.tau_s,
        cell_capacity=section.cell_capacity,
        separate_pool_capacity=section.separate_pool_capacity,
        async_training_cells=section.async_training_cells,
        streaming=section.streaming,
    )
