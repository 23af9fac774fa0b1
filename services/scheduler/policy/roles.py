"""Cell roles and engine ids, the nouns every scheduler event and action uses.

A cell of the pool is in one of four roles. `DRAINING` (leaving rollout for training) and `RETURNING`
(leaving training for rollout) are the two halves of a role transition: in the capacity ledger a
draining cell already counts as training and a returning one does not serve rollout until its
transition completes. Two more roles belong to a pool that changes while the run goes on: `JOINING`
(a new cell loading the published weights: in the pool, not yet a member that serves or trains) and
`GONE` (left or lost; cell ids are never reused, so a gone cell keeps its place in `roles`).

Engines are named by an int: the index of a cell (0..K-1) or `SEPARATE_POOL` (-1, the same value the
protos' `EngineEndpoint.cell` uses for the pool).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Role(StrEnum):
    ROLLOUT = "rollout"
    """Serving model calls with an inference engine."""
    DRAINING = "draining"
    """Leaving rollout: admits no new calls, its executions are rerouted, the trainer is restored."""
    TRAINING = "training"
    """Claiming micro-steps and computing gradients."""
    RETURNING = "returning"
    """Leaving training: the engine is restored with the newest weights; not serving yet."""
    JOINING = "joining"
    """New in the pool: its engine loads the published weights (LoadWeights → CellReady); not serving yet."""
    GONE = "gone"
    """Left the pool with notice or lost for good; nothing is routed to it or claimed by it any more."""


Engine = int
"""A rollout engine: a cell index, or `SEPARATE_POOL`."""

SEPARATE_POOL: Final[Engine] = -1
"""The separate rollout pool (capacity C_s), as one logical engine."""

IN_TRANSITION: Final[frozenset[Role]] = frozenset({Role.DRAINING, Role.RETURNING})

MEMBER_ROLES: Final[frozenset[Role]] = frozenset({Role.ROLLOUT, Role.DRAINING, Role.TRAINING, Role.RETURNING})
"""Roles of the cells that make up K: they hold current weights and take part in the ledger."""
