"""Staleness v_t − v_d is recorded for every consumed group, at packing time."""

from services.scheduler.policy import Role, StalenessRecord, mean_staleness
from tests.unit.scheduler.scenario import Scenario


def test_staleness_is_the_consuming_step_minus_the_dispatch_version():
    # B=1, φ=1, μ=1: g0, g1 dispatched at v=0; g2 at v=1 after the first publication.
    sc = Scenario(num_cells=2, cell_capacity=4, group_size=1, batch_groups=1, phi=1.0, mu=1, rho_min=1.0)
    sc.start()
    sc.finish_group("g0")
    sc.transitioned(0, Role.TRAINING)
    sc.finish_group("g1")
    sc.train_batch(0, ["g0"])  # the core stays: g1 is ready and w + μNB = 0 + 1 ≤ 4
    sc.published(1)
    sc.train_batch(1, ["g1"])
    sc.transitioned(0, Role.ROLLOUT)
    sc.published(2)
    sc.finish_group("g2")
    records = sc.policy.state.staleness
    assert records == [StalenessRecord("g0", 0, 0), StalenessRecord("g1", 0, 1)]
    assert [r.staleness for r in records] == [0, 1]
    assert sc.snapshot.mean_staleness == 0.5
    assert sc.snapshot.consumed_groups == 2


def test_mean_staleness_can_skip_the_start_up_transient():
    records = [StalenessRecord("a", 0, 0), StalenessRecord("b", 0, 1), StalenessRecord("c", 1, 2)]
    assert mean_staleness(records) == (0 + 1 + 1) / 3
    assert mean_staleness(records, from_step=1) == 1.0
    assert mean_staleness(records, from_step=3) is None
