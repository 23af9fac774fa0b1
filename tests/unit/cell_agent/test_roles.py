"""The role state machine: rollout ⇄ draining ⇄ training, one transition at a time."""

from __future__ import annotations

import pytest

from gyre.roles import DRAINING, ROLLOUT, TRAINING, CellRole
from services.cell_agent.roles import RoleError, RoleMachine


def test_round_trip_passes_through_draining() -> None:
    machine = RoleMachine()
    assert machine.role == ROLLOUT
    t = machine.begin(TRAINING)
    assert (t.from_role, t.to_role, machine.role) == (ROLLOUT, TRAINING, DRAINING)
    machine.complete()
    assert machine.role == TRAINING
    machine.begin(ROLLOUT)
    assert machine.role == DRAINING
    done = machine.complete()
    assert machine.role == ROLLOUT and done.elapsed_s() >= 0


def test_failed_transition_returns_to_the_previous_role() -> None:
    machine = RoleMachine(TRAINING)
    machine.begin(ROLLOUT)
    machine.fail()
    assert machine.role == TRAINING and machine.transition is None


@pytest.mark.parametrize(
    ("start", "target", "message"),
    [
        (ROLLOUT, ROLLOUT, "already in rollout"),
        (ROLLOUT, DRAINING, "not a target role"),
    ],
)
def test_refused_transitions(start: CellRole, target: CellRole, message: str) -> None:
    with pytest.raises(RoleError, match=message):
        RoleMachine(start).begin(target)


def test_one_transition_at_a_time() -> None:
    machine = RoleMachine()
    machine.begin(TRAINING)
    with pytest.raises(RoleError, match="is running"):
        machine.begin(ROLLOUT)
    with pytest.raises(RoleError, match="no transition"):
        RoleMachine().complete()
    with pytest.raises(RoleError, match="starts in"):
        RoleMachine(DRAINING)
