"""Staleness of consumed groups: v_t − v_d, recorded when a group is packed into a batch.

v_d is the policy version published when the group was dispatched; v_t is the version the consuming
optimizer step trains on (the step index). Under boundary dispatch the steady-state mean is
φ + (μ − 1)/2 (paper Appendix A); the first burst, dispatched at version 0, is a start-up transient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StalenessRecord:
    group_id: str
    dispatch_version: int
    """v_d."""
    train_version: int
    """v_t: the step that consumed the group."""

    @property
    def staleness(self) -> int:
        return self.train_version - self.dispatch_version


def mean_staleness(records: Sequence[StalenessRecord], *, from_step: int = 0) -> float | None:
    """Group-weighted mean staleness over groups consumed at step ≥ `from_step` (None if there are none)."""
    total = 0
    count = 0
    for r in records:
        if r.train_version >= from_step:
            total += r.train_version - r.dispatch_version
            count += 1
    return total / count if count else None
