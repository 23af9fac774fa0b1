"""The role state machine: rollout ⇄ draining ⇄ training, one transition at a time."""

from __future__ import annotations

import pytest

from services.cell_agent.roles import Role, RoleError, RoleMachine


def test_round_trip_passes_through_draining() -> None:
    machine = RoleMachine()
    assert machine.role is Role.ROLLOUT
    t = machine.begin(Role.TRAINING)
    assert (t.from_role, t.to_role, machine.role) == (Role.ROLLOUT, Role.TRAINING, Role.DRAINING)
    machine.complete()
    assert machine.role is Role.TRAINING
    machine.begin(Role.ROLLOUT)
    assert machine.role is Role.DRAINING
    done = machine.complete()
    assert machine.role is Role.ROLLOUT and done.elapsed_s() >= 0


def test_failed_transition_returns_to_the_previous_role() -> None:
    machine = RoleMachine(Role.TRAINING)
    machine.begin(Role.ROLLOUT)
    machine.fail()
    assert machine.role is Role.TRAINING and machine.transition is None


@pytest.mark.parametrize(
    ("start", "target", "message"),
    [
        (Role.ROLLOUT, Role.ROLLOUT, "already in rollout"),
        (Role.ROLLOUT, Role.DRAINING, "not a target role"),
    ],
)
def test_refused_transitions(start: Role, target: Role, message: str) -> None:
    with pytest.raises(RoleError, match=message):
        RoleMachine(start).begin(target)


def test_one_transition_at_a_time() -> None:
    machine = RoleMachine()
    machine.begin(Role.TRAINING)
    with pytest.raises(RoleError, match="is running"):
        machine.begin(Role.ROLLOUT)
    with pytest.raises(RoleError, match="no transition"):
        RoleMachine().complete()
    with pytest.raises(RoleError, match="starts in"):
        RoleMachine(Role.DRAINING)
