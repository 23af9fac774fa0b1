"""Boundary dispatch and the start rule, on hand-computed scenarios."""

from services.scheduler.policy import (
    DispatchGroups,
    EndBurst,
    OpenBatch,
    PublishWeights,
    Role,
    StartExecutions,
)
from tests.unit.scheduler.scenario import Scenario, starts, transitions


def test_run_start_dispatches_phi_plus_mu_batches_and_fills_capacity_in_reroute_order():
    # K=3 cells of C_e=4, no pool. (φ + μ)·B = (1 + 2)·2 = 6 groups = 12 executions = C_R.
    sc = Scenario(num_cells=3, cell_capacity=4, group_size=2, batch_groups=2, phi=1.0, mu=2)
    actions = sc.start()
    assert DispatchGroups(num_groups=6, group_size=2, policy_version=0) in actions
    assert OpenBatch(step=0) in actions
    # Highest cell first, core last: the core is the first to leave rollout.
    assert starts(actions) == [(2, 4), (1, 4), (0, 4)]
    snap = sc.snapshot
    assert (snap.dispatched, snap.started, snap.finished) == (12, 12, 0)
    assert (snap.queued, snap.running, snap.waterlevel, snap.rollout_capacity) == (0, 12, 12, 12)


def test_start_rule_starts_min_of_queued_and_free_capacity():
    # K=2, C_e=3: C_R = 6. Dispatch (1 + 1)·2 = 4 groups of 2 = 8 executions; 6 start, 2 queue.
    sc = Scenario(num_cells=2, cell_capacity=3, group_size=2, batch_groups=2, phi=1.0, mu=1)
    assert starts(sc.start()) == [(1, 3), (0, 3)]
    assert sc.snapshot.queued == 2
    # g1.1 ran on cell 0 (cell 1 took g0.0, g0.1, g1.0): its slot is the only free one.
    assert sc.engine["g1.1"] == 0
    assert starts(sc.terminate("g1.1")) == [(0, 1)]
    assert sc.engine["g3.0"] == 0
    assert starts(sc.terminate("g0.0")) == [(1, 1)]
    # The queue is empty now: min(d − p, C_R − (p − f)) = min(0, 1) = 0.
    assert starts(sc.terminate("g0.1")) == []
    snap = sc.snapshot
    assert (snap.dispatched, snap.started, snap.finished, snap.queued) == (8, 8, 3, 0)


def test_dispatch_is_constant_inside_a_burst_and_grows_by_mu_n_b_after_publication():
    # K=2, C_e=4, N=2, B=1, φ=1, μ=1: d = (1 + 1)·1·2 = 4 at the start.
    sc = Scenario(num_cells=2, cell_capacity=4, group_size=2, batch_groups=1, phi=1.0, mu=1, rho_min=1.0)
    sc.start()
    assert sc.snapshot.dispatched == 4
    assert transitions(sc.finish_group("g0")) == [(0, Role.TRAINING)]
    sc.transitioned(0, Role.TRAINING)
    assert sc.snapshot.dispatched == 4
    actions = sc.train_batch(0, ["g0"])
    # Burst end (μ = 1): g1 is not ready, so the core returns; d is still 4 until the publication.
    assert EndBurst(1) in actions and PublishWeights(1) in actions and OpenBatch(1) in actions
    assert not any(isinstance(a, DispatchGroups) for a in actions)
    assert sc.snapshot.dispatched == 4
    sc.transitioned(0, Role.ROLLOUT)
    actions = sc.published(1)
    assert DispatchGroups(num_groups=1, group_size=2, policy_version=1) in actions
    assert sc.snapshot.dispatched == 6
    assert any(isinstance(a, StartExecutions) for a in actions)
