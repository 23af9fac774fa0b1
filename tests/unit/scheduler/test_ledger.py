"""Eq. 1–3 and the start rule as plain functions."""

from services.scheduler.policy import ledger


def test_rollout_capacity_is_pool_plus_rollout_cells():
    # Eq. 1 with C_s = 144, K − k = 5, C_e = 144.
    assert ledger.rollout_capacity(separate_pool_capacity=144, num_rollout_cells=5, cell_capacity=144) == 864
    assert ledger.rollout_capacity(separate_pool_capacity=0, num_rollout_cells=0, cell_capacity=144) == 0


def test_start_rule_is_min_of_queued_and_free_capacity():
    # d=1792, p=1152, f=10: queued 640, free 1152 − 1142 = 10.
    assert ledger.startable(dispatched=1792, started=1152, finished=10, capacity=1152) == 10
    assert ledger.startable(dispatched=1800, started=1795, finished=900, capacity=1152) == 5
    assert (
        ledger.startable(dispatched=10, started=10, finished=0, capacity=4) == 0
    )  # over capacity: never negative


def test_waterlevel_test_eq2():
    # E0 at burst start: d = (0.5 + 3)·16·32 = 1792, C_R = 1152, C_e = 144 → the core leaves at f ≥ 784.
    assert not ledger.may_release(
        waterlevel=ledger.waterlevel(1792, 783), capacity=1152, released_capacity=144
    )
    assert ledger.may_release(waterlevel=ledger.waterlevel(1792, 784), capacity=1152, released_capacity=144)


def test_core_stays_eq3():
    # w + μNB ≤ C_s + (K − 1)·C_e with μNB = 1536, K = 8, C_e = 144: needs w ≤ 1008 − 1536 < 0.
    assert not ledger.core_may_stay(waterlevel=0, next_dispatch=1536, capacity_without_core=1008)
    assert ledger.core_may_stay(waterlevel=100, next_dispatch=900, capacity_without_core=1008)
    assert not ledger.core_may_stay(waterlevel=109, next_dispatch=900, capacity_without_core=1008)
