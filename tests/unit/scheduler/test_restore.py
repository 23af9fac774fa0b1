"""The policy rebuilds from persisted counters, roles and versions and carries on identically."""

import pytest

from services.scheduler.policy import ExecutionTerminated, Policy, PolicyState, Role
from tests.unit.scheduler.scenario import Scenario


def test_restored_policy_makes_the_same_decisions():
    sc = Scenario(num_cells=2, cell_capacity=3, group_size=2, batch_groups=2, phi=1.0, mu=1)
    sc.start()
    sc.terminate("g0.0")
    s = sc.policy.state
    restored = Policy(
        sc.params,
        PolicyState.restore(
            sc.params,
            dispatched=s.dispatched,
            started=s.started,
            finished=s.finished,
            roles=list(s.roles),
            version=s.version,
            published_version=s.published_version,
            running={e: sc.policy.state.placement.engine_of(e) for e in sc.engine},
            groups=dict(s.groups),
            now_s=sc.now,
        ),
    )
    assert restored.snapshot().waterlevel == sc.snapshot.waterlevel
    assert restored.snapshot().engine_loads == sc.snapshot.engine_loads
    event = ExecutionTerminated(sc.now, "g1.1")
    assert restored.handle(event) == sc.policy.handle(event)


def test_restore_rejects_inconsistent_counters():
    params = Scenario(num_cells=2).params
    with pytest.raises(ValueError, match="d >= p >= f"):
        PolicyState.restore(
            params,
            dispatched=1,
            started=2,
            finished=0,
            roles=[Role.ROLLOUT] * 2,
            version=0,
            published_version=0,
            running={},
        )
    with pytest.raises(ValueError, match="p - f"):
        PolicyState.restore(
            params,
            dispatched=2,
            started=2,
            finished=0,
            roles=[Role.ROLLOUT] * 2,
            version=0,
            published_version=0,
            running={"a": 0},
        )
    with pytest.raises(ValueError, match="does not serve rollout"):
        PolicyState.restore(
            params,
            dispatched=1,
            started=1,
            finished=0,
            roles=[Role.TRAINING, Role.ROLLOUT],
            version=0,
            published_version=0,
            running={"a": 0},
        )
