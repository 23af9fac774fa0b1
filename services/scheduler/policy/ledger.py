"""The capacity ledger and the rules written on it (paper Eq. 1–3), as plain functions.

    C_R = C_s + (K − k)·C_e                         rollout capacity, k = cells not serving rollout (Eq. 1)
    start min(d − p, C_R − (p − f))                 the start rule
    w = d − f                                       the waterlevel
    w ≤ C_R − C_e                                   the next cell may leave rollout (Eq. 2)
    w + μNB ≤ C_s + (K − 1)·C_e                     the core may stay in training at burst end (Eq. 3)

K is the pool as it is now (its members: cells that joined count once they hold current weights, cells
that left or were lost no longer count). `colocate` moves all K cells as one unit, so its Eq. 2 and Eq. 3 release K·C_e instead of C_e; the
functions take the released capacity as an argument to serve both.
"""

from __future__ import annotations


def rollout_capacity(*, separate_pool_capacity: int, num_rollout_cells: int, cell_capacity: int) -> int:
    """C_R (Eq. 1): the separate pool plus every cell that serves rollout."""
    return separate_pool_capacity + num_rollout_cells * cell_capacity


def waterlevel(dispatched: int, finished: int) -> int:
    """w = d − f: queued plus running executions."""
    return dispatched - finished


def startable(*, dispatched: int, started: int, finished: int, capacity: int) -> int:
    """Executions to start now: min(d − p, C_R − (p − f)), never negative."""
    return max(0, min(dispatched - started, capacity - (started - finished)))


def may_release(*, waterlevel: int, capacity: int, released_capacity: int) -> bool:
    """Eq. 2: after `released_capacity` leaves rollout, the rest still covers every unfinished execution."""
    return waterlevel <= capacity - released_capacity


def core_may_stay(*, waterlevel: int, next_dispatch: int, capacity_without_core: int) -> bool:
    """Eq. 3: rollout without the core covers the outstanding work plus the dispatch about to come."""
    return waterlevel + next_dispatch <= capacity_without_core
