"""`async` and `colocate` are parameter values of the same policy: check their allocation rules."""

import pytest

from services.scheduler.policy import (
    SEPARATE_POOL,
    BeginTransition,
    DispatchGroups,
    EndBurst,
    Mode,
    OpenBatch,
    PublishWeights,
    Role,
)
from tests.unit.scheduler.scenario import Scenario, starts, transitions


def test_async_trains_a_fixed_prefix_and_publishes_after_every_step():
    # K=3, T=1: cell 0 trains for the whole run, cells 1-2 roll out (C_R = 8). μ = 1, φ = 1.
    sc = Scenario(
        mode=Mode.ASYNC,
        num_cells=3,
        async_training_cells=1,
        cell_capacity=4,
        group_size=1,
        batch_groups=1,
        phi=1.0,
        mu=1,
    )
    actions = sc.start()
    assert actions[0] == BeginTransition(0, Role.TRAINING)
    assert DispatchGroups(num_groups=2, group_size=1, policy_version=0) in actions
    assert starts(actions) == [(2, 2)]
    assert sc.snapshot.rollout_capacity == 8
    sc.transitioned(0, Role.TRAINING)
    assert transitions(sc.finish_group("g0")) == []
    actions = sc.train_batch(0, ["g0"])
    assert EndBurst(1) in actions and PublishWeights(1) in actions and OpenBatch(1) in actions
    assert transitions(actions) == []  # the training cells never return
    actions = sc.published(1)
    assert DispatchGroups(num_groups=1, group_size=1, policy_version=1) in actions
    assert sc.snapshot.roles == (Role.TRAINING, Role.ROLLOUT, Role.ROLLOUT)


def test_async_never_lets_a_rollout_cell_join():
    sc = Scenario(
        mode=Mode.ASYNC,
        num_cells=3,
        async_training_cells=1,
        cell_capacity=8,
        group_size=1,
        batch_groups=4,
        phi=0.0,
        mu=1,
        rho_min=0.25,
    )
    sc.start()
    sc.transitioned(0, Role.TRAINING)
    for g in range(4):
        assert transitions(sc.finish_group(f"g{g}")) == []


def test_colocate_moves_every_cell_at_once_when_the_pool_covers_the_waterlevel():
    # K=3, C_e=2, C_s=2: both groups run on the pool; Eq. 2 releases K·C_e: w ≤ 8 − 6 = 2.
    sc = Scenario(
        mode=Mode.COLOCATE,
        num_cells=3,
        cell_capacity=2,
        separate_pool_capacity=2,
        group_size=1,
        batch_groups=2,
        phi=0.0,
        mu=1,
    )
    assert starts(sc.start()) == [(SEPARATE_POOL, 2)]
    assert transitions(sc.finish_group("g0")) == [(0, Role.TRAINING), (1, Role.TRAINING), (2, Role.TRAINING)]
    for cell in range(3):
        sc.transitioned(cell, Role.TRAINING)
    sc.finish_group("g1")
    # Eq. 3 for the whole unit: w + μNB = 0 + 2 ≤ C_s = 2 holds, but no group is ready for the next batch.
    actions = sc.train_batch(0, ["g0", "g1"])
    assert transitions(actions) == [(0, Role.ROLLOUT), (1, Role.ROLLOUT), (2, Role.ROLLOUT)]


def test_colocate_drains_complete_in_any_order_and_no_cell_returns_early():
    # The same unit; the satellites' drains complete before the core's (they had less to drain): each
    # stays in training (a cell that completes a drain returns at once only when the cells before it
    # went back to rollout, not while they are still draining).
    sc = Scenario(
        mode=Mode.COLOCATE,
        num_cells=3,
        cell_capacity=2,
        separate_pool_capacity=2,
        group_size=1,
        batch_groups=2,
        phi=0.0,
        mu=1,
    )
    sc.start()
    assert transitions(sc.finish_group("g0")) == [(0, Role.TRAINING), (1, Role.TRAINING), (2, Role.TRAINING)]
    for cell in (2, 1, 0):
        assert transitions(sc.transitioned(cell, Role.TRAINING)) == []
    assert sc.policy.state.roles == [Role.TRAINING] * 3


def test_colocate_without_a_pool_waits_for_every_execution():
    sc = Scenario(
        mode=Mode.COLOCATE, num_cells=2, cell_capacity=2, group_size=1, batch_groups=1, phi=1.0, mu=1
    )
    sc.start()
    assert transitions(sc.finish_group("g0")) == []  # w = 1 > C_s = 0
    assert transitions(sc.finish_group("g1")) == [(0, Role.TRAINING), (1, Role.TRAINING)]


@pytest.mark.parametrize(
    ("mode", "phi", "mu", "expected"),
    [
        (Mode.ELASTIC, 0.5, 3, 1.5),
        (Mode.ASYNC, 1.5, 1, 1.5),
        (Mode.COLOCATE, 0.0, 4, 1.5),
        (Mode.ELASTIC, 1.0, 2, 1.5),
    ],
)
def test_expected_staleness_is_phi_plus_half_mu_minus_one(mode, phi, mu, expected):
    sc = Scenario(
        mode=mode, num_cells=4, group_size=2, batch_groups=4, phi=phi, mu=mu, async_training_cells=2
    )
    assert sc.params.expected_staleness == expected
    assert sc.params.initial_dispatch_groups == round((phi + mu) * 4)
    assert sc.params.burst_dispatch_groups == mu * 4


def test_publications_may_complete_after_the_next_step_and_each_brings_its_dispatch():
    # Async, μ = 1: the core trains batch 1 before the weights of version 1 reach the engines.
    sc = Scenario(
        mode=Mode.ASYNC,
        num_cells=2,
        async_training_cells=1,
        cell_capacity=4,
        group_size=1,
        batch_groups=1,
        phi=1.0,
        mu=1,
    )
    sc.start()
    sc.transitioned(0, Role.TRAINING)
    sc.finish_group("g0")
    sc.finish_group("g1")
    assert PublishWeights(1) in sc.train_batch(0, ["g0"])
    assert PublishWeights(2) in sc.train_batch(1, ["g1"])
    with pytest.raises(ValueError, match=r"\[1, 2\] were pending"):
        sc.published(2)
    assert DispatchGroups(num_groups=1, group_size=1, policy_version=1) in sc.published(1)
    assert DispatchGroups(num_groups=1, group_size=1, policy_version=2) in sc.published(2)
    assert sc.snapshot.published_version == 2 and sc.snapshot.burst == 2
