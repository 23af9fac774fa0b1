"""Waterlevel control (Eq. 2), serial transitions and reroute destinations, on hand-computed scenarios."""

from services.scheduler.policy import SEPARATE_POOL, RerouteExecutions, Role
from tests.unit.scheduler.scenario import Scenario, transitions


def _three_cells() -> Scenario:
    # K=3, C_e=4, N=2, B=2, φ=1, μ=2: 6 groups = 12 executions fill C_R = 12.
    # cell 2: g0.*, g1.*   cell 1: g2.*, g3.*   cell 0: g4.*, g5.*   ρ_min·B = 1 group, τ = 0.
    sc = Scenario(num_cells=3, cell_capacity=4, group_size=2, batch_groups=2, phi=1.0, mu=2)
    sc.start()
    return sc


def test_waterlevel_blocks_the_core_until_w_reaches_c_r_minus_c_e():
    sc = _three_cells()
    assert sc.terminate("g0.0", "g0.1", "g1.0") == []  # w = 9, nothing queued to start
    assert transitions(sc.ready("g0")) == []  # supply holds, but w = 9 > C_R − C_e = 8
    actions = sc.terminate("g1.1")  # w = 8
    assert transitions(actions) == [(0, Role.TRAINING)]
    # The core's executions move to the highest cell with room: cell 2 (where g0, g1 ended).
    assert [a for a in actions if isinstance(a, RerouteExecutions)] == [
        RerouteExecutions(source=0, destination=2, execution_ids=("g4.0", "g4.1", "g5.0", "g5.1"))
    ]
    assert all(sc.engine[f"g{g}.{j}"] == 2 for g in (4, 5) for j in (0, 1))
    snap = sc.snapshot
    assert snap.roles == (Role.DRAINING, Role.ROLLOUT, Role.ROLLOUT)
    assert snap.rollout_capacity == 8


def test_waterlevel_blocks_the_second_transition_until_exactly_the_fourth_termination():
    sc = _three_cells()
    sc.terminate("g0.0", "g0.1", "g1.0", "g1.1")
    sc.ready("g0")
    sc.transitioned(0, Role.TRAINING)
    sc.ready("g1")
    sc.pack("g0", 0)
    sc.claim(0, 0, "g0")
    # Supply: min(ready-unclaimed = 1, batch needs 2 − 1 = 1) = 1 ≥ ρ_min·B = 1 holds.
    # Cell 1 may leave when w ≤ C_R − C_e = 8 − 4 = 4; w is 8 now.
    assert transitions(sc.terminate("g2.0")) == []  # w = 7
    assert transitions(sc.terminate("g2.1")) == []  # w = 6
    assert transitions(sc.terminate("g3.0")) == []  # w = 5
    assert transitions(sc.terminate("g3.1")) == [(1, Role.TRAINING)]  # w = 4
    assert sc.snapshot.waterlevel == 4


def test_transitions_are_serial_and_the_training_cells_a_growing_prefix():
    # Plenty of capacity and supply: only seriality orders the joins.
    sc = Scenario(num_cells=3, cell_capacity=8, group_size=1, batch_groups=4, phi=0.0, mu=1, rho_min=0.25)
    sc.start()
    assert transitions(sc.finish_group("g0")) == [(0, Role.TRAINING)]
    assert transitions(sc.finish_group("g1")) == []  # cell 0 is still draining
    assert transitions(sc.transitioned(0, Role.TRAINING)) == [(1, Role.TRAINING)]
    assert transitions(sc.finish_group("g2")) == []
    # The last cell leaves only when nothing is outstanding: w = 1 (g3) > C_R − C_e = 0.
    assert transitions(sc.transitioned(1, Role.TRAINING)) == []
    assert transitions(sc.finish_group("g3")) == [(2, Role.TRAINING)]
    sc.transitioned(2, Role.TRAINING)
    assert sc.snapshot.roles == (Role.TRAINING,) * 3
    assert sc.snapshot.rollout_capacity == 0


def test_reroute_fills_the_separate_pool_first_then_the_highest_rollout_cell():
    # K=3, C_e=2, C_s=2, N=1, B=2, φ=2, μ=2: 8 groups of 1 fill C_R = 8:
    # pool: g0, g1   cell 2: g2, g3   cell 1: g4, g5   cell 0: g6, g7
    sc = Scenario(
        num_cells=3, cell_capacity=2, separate_pool_capacity=2, group_size=1, batch_groups=2, phi=2.0, mu=2
    )
    sc.start()
    assert [sc.engine[f"g{g}.0"] for g in range(8)] == [SEPARATE_POOL] * 2 + [2, 2, 1, 1, 0, 0]
    sc.terminate("g0.0", "g2.0")  # one free slot on the pool, one on cell 2; w = 6 = C_R − C_e
    actions = sc.ready("g0")
    assert transitions(actions) == [(0, Role.TRAINING)]
    assert [a for a in actions if isinstance(a, RerouteExecutions)] == [
        RerouteExecutions(source=0, destination=SEPARATE_POOL, execution_ids=("g6.0",)),
        RerouteExecutions(source=0, destination=2, execution_ids=("g7.0",)),
    ]
