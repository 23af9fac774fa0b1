"""Events that contradict the policy's state are rejected with a message naming the problem."""

import pytest

from services.scheduler.policy import (
    ExecutionStarted,
    ExecutionTerminated,
    GroupDispatched,
    GroupReady,
    Role,
    RunStarted,
    StepCompleted,
    TransitionCompleted,
    WeightsPublished,
)
from tests.unit.scheduler.scenario import Scenario


def _started() -> Scenario:
    sc = Scenario(num_cells=2, cell_capacity=4, group_size=1, batch_groups=2, phi=0.0, mu=1)
    sc.at(10.0).start()
    return sc


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (ExecutionTerminated(5.0, "g0.0"), "time order"),
        (RunStarted(10.0), "already started"),
        (GroupDispatched(10.0, "g0", 1, 0), "dispatched twice"),
        (GroupDispatched(10.0, "gx", 3, 0), "N is 1"),
        (GroupReady(10.0, "nope"), "unknown group"),
        (ExecutionTerminated(10.0, "never"), "never started"),
        (ExecutionStarted(10.0, "g0.0", 1), "started twice"),
        (ExecutionStarted(10.0, "late", 0), "without a reservation"),
        (StepCompleted(10.0, 2), "expected 1"),
        (TransitionCompleted(10.0, 1, Role.TRAINING), "while rollout"),
        (WeightsPublished(10.0, 0), r"but \[\] were pending"),
    ],
)
def test_contradicting_events_raise(event, message):
    sc = _started()
    with pytest.raises(ValueError, match=message):
        sc.policy.handle(event)


def test_claims_are_checked_against_roles_and_the_open_batch():
    sc = _started()
    sc.ready("g0")
    with pytest.raises(ValueError, match="open batch is 0"):
        sc.pack("g0", 3)
    sc.pack("g1", 0)  # packed before its GroupReady arrived (the packer saw it ready first): ready now
    assert sc.policy.snapshot().batch_packed == 1
    sc.ready("g1")  # the late GroupReady changes nothing
    sc.pack("g0", 0)
    with pytest.raises(ValueError, match="packed twice"):
        sc.pack("g0", 0)
    with pytest.raises(ValueError, match="while rollout"):
        sc.claim(1, 0, "g0")


def test_a_redelivered_group_ready_changes_nothing():
    sc = _started()
    sc.ready("g0")
    sc.ready("g0")
    assert sc.snapshot.ready_unclaimed == 1
