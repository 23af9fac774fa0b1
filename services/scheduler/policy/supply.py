"""The supply check: is there enough claimable training work to justify one more training cell?

    supply = min(ready-unclaimed groups, groups the current batch still needs)      (streaming)

A group is *claimed* once a training cell claimed one of its micro-steps, so "ready-unclaimed" counts
both groups still in the trajectory buffer and groups packed but not yet touched. Without streaming a
batch is materialized whole, so nothing is claimable until every group it still needs is ready.

A cell may join only after `supply ≥ ρ_min·B` held without interruption for τ seconds; the timer
restarts after every role transition and at the start of every batch.
"""

from __future__ import annotations

from dataclasses import dataclass


def claimable_groups(*, ready_unclaimed: int, batch_needs: int, streaming: bool) -> int:
    """Groups of the current batch a joining cell could work on right now."""
    if batch_needs <= 0:
        return 0
    if not streaming and ready_unclaimed < batch_needs:
        return 0
    return min(ready_unclaimed, batch_needs)


@dataclass(slots=True)
class SupplyTimer:
    """Since when the supply check has held without interruption (None: it does not hold)."""

    since_s: float | None = None

    def observe(self, now_s: float, holds: bool) -> None:
        """Record the check's value at `now_s`; a failure clears the timer."""
        if not holds:
            self.since_s = None
        elif self.since_s is None:
            self.since_s = now_s

    def restart(self, now_s: float, holds: bool) -> None:
        """Reset the timer (after a transition, at a batch start): it counts again from `now_s`."""
        self.since_s = now_s if holds else None

    def due_s(self, tau_s: float) -> float | None:
        """When the check will have held for τ (None while it does not hold)."""
        return None if self.since_s is None else self.since_s + tau_s
