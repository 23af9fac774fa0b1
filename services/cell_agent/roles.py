"""The role state machine of a cell: rollout ⇄ draining ⇄ training.

A transition passes through DRAINING in both directions (the cell serves nothing and trains nothing
while it moves): it is begun, then completed (or failed, which puts the cell back where it was).
Only one transition runs at a time. Pure logic; the cell agent does the work and reports events. Roles
are the wire's values (`gyre.roles`: what GetStatus reports and the events carry).

    machine = RoleMachine()                         # starts in rollout
    t = machine.begin(TRAINING)                     # role is DRAINING now
    ...                                             # hand back requests, release engine memory
    machine.complete()                              # role is TRAINING
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gyre.roles import DRAINING, ROLLOUT, CellRole, role_name


class RoleError(ValueError):
    """A transition that the state machine does not allow now."""


@dataclass(slots=True)
class Transition:
    from_role: CellRole
    to_role: CellRole
    started_s: float
    """`time.monotonic()` when it began."""

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s


class RoleMachine:
    def __init__(self, role: CellRole = ROLLOUT) -> None:
        if role == DRAINING:
            raise RoleError("a cell starts in rollout or training, not draining")
        self._role: CellRole = role
        self._transition: Transition | None = None

    @property
    def role(self) -> CellRole:
        return DRAINING if self._transition is not None else self._role

    @property
    def transition(self) -> Transition | None:
        return self._transition

    def begin(self, to_role: CellRole) -> Transition:
        if to_role == DRAINING:
            raise RoleError("draining is not a target role; ask for rollout or training")
        if self._transition is not None:
            raise RoleError(
                f"a transition {role_name(self._transition.from_role)} → {role_name(self._transition.to_role)} is running"
            )
        if to_role == self._role:
            raise RoleError(f"the cell is already in {role_name(to_role)}")
        self._transition = Transition(self._role, to_role, time.monotonic())
        return self._transition

    def complete(self) -> Transition:
        t = self._require()
        self._role = t.to_role
        self._transition = None
        return t

    def fail(self) -> Transition:
        """The transition failed: the cell is back in its previous role."""
        t = self._require()
        self._transition = None
        return t

    def _require(self) -> Transition:
        if self._transition is None:
            raise RoleError("no transition is running")
        return self._transition
