"""The burst boundary: satellites return, the core stays only under supply and Eq. 3, weights publish."""

from services.scheduler.policy import DispatchGroups, EndBurst, OpenBatch, PublishWeights, Role
from tests.unit.scheduler.scenario import Scenario, transitions


def test_burst_end_returns_every_satellite_and_publishes():
    # K=3, C_e=4, N=1, B=1, φ=0, μ=2, ρ_min·B = 1: two groups, both on cell 2.
    sc = Scenario(num_cells=3, cell_capacity=4, group_size=1, batch_groups=1, phi=0.0, mu=2, rho_min=1.0)
    sc.start()
    assert transitions(sc.finish_group("g0")) == [(0, Role.TRAINING)]
    assert transitions(sc.transitioned(0, Role.TRAINING)) == [(1, Role.TRAINING)]  # w = 1 ≤ 8 − 4
    sc.transitioned(1, Role.TRAINING)
    actions = sc.train_batch(0, ["g0"])
    assert OpenBatch(1) in actions and not any(isinstance(a, EndBurst) for a in actions)
    assert transitions(sc.finish_group("g1")) == [(2, Role.TRAINING)]  # w = 0 ≤ C_R − C_e = 0
    sc.transitioned(2, Role.TRAINING)
    actions = sc.train_batch(1, ["g1"], cell=2)
    # Nothing is ready for the next batch, so the core returns too.
    assert transitions(actions) == [(0, Role.ROLLOUT), (1, Role.ROLLOUT), (2, Role.ROLLOUT)]
    kinds = [type(a).__name__ for a in actions]
    assert kinds.index("EndBurst") < kinds.index("BeginTransition") < kinds.index("PublishWeights")
    assert EndBurst(2) in actions and PublishWeights(2) in actions and OpenBatch(2) in actions
    for cell in range(3):
        sc.transitioned(cell, Role.ROLLOUT)
    assert DispatchGroups(num_groups=2, group_size=1, policy_version=2) in sc.published(2)


def _core_with_leftover(finish_g3: bool, g2_ready: bool = True) -> Scenario:
    # K=2, C_e=2, N=1, B=2, φ=1, μ=1: 4 groups fill C_R = 4 (cell 1: g0, g1; cell 0: g2, g3).
    # Eq. 3 at burst end: w + μNB ≤ C_s + (K − 1)·C_e, i.e. w + 2 ≤ 2.
    sc = Scenario(num_cells=2, cell_capacity=2, group_size=1, batch_groups=2, phi=1.0, mu=1)
    sc.start()
    sc.finish_group("g0")
    assert transitions(sc.finish_group("g1")) == [(0, Role.TRAINING)]  # w = 2 ≤ 4 − 2
    sc.transitioned(0, Role.TRAINING)
    if g2_ready:
        sc.finish_group("g2")
    else:
        sc.terminate("g2.0")  # ended, but its evaluation is not in: not ready
    if finish_g3:
        sc.terminate("g3.0")
    return sc


def test_core_stays_when_the_next_batch_has_supply_and_eq3_holds():
    sc = _core_with_leftover(finish_g3=True)  # w = 0: 0 + 2 ≤ 2
    actions = sc.train_batch(0, ["g0", "g1"])
    assert EndBurst(1) in actions
    assert transitions(actions) == []
    assert sc.snapshot.roles[0] is Role.TRAINING


def test_core_returns_when_eq3_fails():
    sc = _core_with_leftover(finish_g3=False)  # w = 1: 1 + 2 > 2
    assert transitions(sc.train_batch(0, ["g0", "g1"])) == [(0, Role.ROLLOUT)]


def test_core_returns_when_the_next_batch_lacks_supply():
    sc = _core_with_leftover(finish_g3=True, g2_ready=False)  # Eq. 3 holds, no ready group
    assert transitions(sc.train_batch(0, ["g0", "g1"])) == [(0, Role.ROLLOUT)]


def test_no_cell_joins_between_burst_end_and_publication():
    sc = _core_with_leftover(finish_g3=False)
    sc.train_batch(0, ["g0", "g1"])
    # Back in rollout: w = 1 ≤ C_R − C_e = 2 and g2 is ready, but the publication is pending.
    assert transitions(sc.transitioned(0, Role.ROLLOUT)) == []
    assert sc.snapshot.waterlevel == 1
    actions = sc.published(1)  # dispatches μNB = 2: w = 3 > 2, so still no join
    assert transitions(actions) == []
    assert sc.snapshot.waterlevel == 3


def test_a_cell_whose_drain_outlasted_its_burst_returns_at_once():
    # As above, but cell 2 is still draining when the batch of cells 0 and 1 ends the burst (its drain was
    # slow: the cell restarted under it). The prefix cells return; cell 2 returns as soon as it arrives.
    sc = Scenario(num_cells=3, cell_capacity=4, group_size=1, batch_groups=1, phi=0.0, mu=2, rho_min=1.0)
    sc.start()
    sc.finish_group("g0")
    sc.transitioned(0, Role.TRAINING)
    sc.transitioned(1, Role.TRAINING)
    sc.train_batch(0, ["g0"])
    assert transitions(sc.finish_group("g1")) == [(2, Role.TRAINING)]
    actions = sc.train_batch(1, ["g1"], cell=1)
    assert transitions(actions) == [(0, Role.ROLLOUT), (1, Role.ROLLOUT)]
    assert transitions(sc.transitioned(2, Role.TRAINING)) == [(2, Role.ROLLOUT)]
    for cell in range(3):
        sc.transitioned(cell, Role.ROLLOUT)
    assert sc.policy.state.roles == [Role.ROLLOUT] * 3
