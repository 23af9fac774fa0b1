"""The supply check inside the policy: held for τ without interruption, restarted by transitions and batches."""

from services.scheduler.policy import Role, ScheduleTick
from tests.unit.scheduler.scenario import Scenario, transitions


def _ticks(actions):
    return [a.at_s for a in actions if isinstance(a, ScheduleTick)]


def test_join_waits_until_supply_held_for_tau():
    # K=2, C_e=4, N=1, B=2, φ=0, μ=1: w = 2 ≤ C_R − C_e = 4 from the start; ρ_min·B = 1 group.
    sc = Scenario(num_cells=2, cell_capacity=4, group_size=1, batch_groups=2, phi=0.0, mu=1, tau_s=10.0)
    sc.start()
    actions = sc.at(100.0).finish_group("g0")
    assert transitions(actions) == []
    assert _ticks(actions) == [110.0]
    assert sc.snapshot.supply_since_s == 100.0
    actions = sc.at(105.0).tick()
    assert actions == []  # not yet, and the tick is not asked for twice
    assert transitions(sc.at(110.0).tick()) == [(0, Role.TRAINING)]


def test_an_interruption_restarts_the_timer_and_a_transition_restarts_it_too():
    # K=3, C_e=4, N=1, B=4, ρ_min·B = 2 groups, τ = 10. Four groups of one execution, all on cell 2.
    sc = Scenario(num_cells=3, cell_capacity=4, group_size=1, batch_groups=4, phi=0.0, mu=1, tau_s=10.0)
    sc.start()
    sc.at(1.0).finish_group("g0")
    assert _ticks(sc.at(1.0).finish_group("g1")) == [11.0]
    assert transitions(sc.at(11.0).tick()) == [(0, Role.TRAINING)]
    assert (
        transitions(sc.at(15.0).tick()) == []
    )  # during the transition: serial, and τ counts afresh after it
    # The transition completes at 20: the timer counts from 20 (supply min(2, 4) = 2 still holds;
    # w = 2 ≤ C_R − C_e = 4).
    assert _ticks(sc.at(20.0).transitioned(0, Role.TRAINING)) == [30.0]
    sc.at(25.0).pack("g0", 0)
    sc.at(25.0).claim(0, 0, "g0")  # supply = min(1, 3) = 1 < 2: interrupted
    assert sc.snapshot.supply_since_s is None
    assert transitions(sc.at(30.0).tick()) == []
    assert _ticks(sc.at(40.0).finish_group("g2")) == [50.0]  # min(2, 3) = 2 again, since 40
    assert transitions(sc.at(50.0).tick()) == [(1, Role.TRAINING)]


def test_the_timer_restarts_at_every_batch_start():
    sc = Scenario(
        num_cells=3, cell_capacity=4, group_size=1, batch_groups=1, phi=2.0, mu=2, rho_min=1.0, tau_s=10.0
    )
    sc.start()
    sc.at(1.0).finish_group("g0")
    sc.at(1.0).finish_group("g1")
    sc.at(11.0).tick()
    sc.at(12.0).transitioned(0, Role.TRAINING)
    assert sc.snapshot.supply_since_s == 12.0
    sc.at(15.0).train_batch(0, ["g0"])  # step 1 done at 15: batch 1 opens, g1 is ready and unclaimed
    assert sc.snapshot.batch_step == 1
    assert sc.snapshot.supply_since_s == 15.0


def test_without_streaming_nothing_is_claimable_until_the_whole_batch_is_ready():
    for streaming, joins_after in ((True, "g0"), (False, "g1")):
        sc = Scenario(
            num_cells=2, cell_capacity=4, group_size=1, batch_groups=2, phi=0.0, mu=1, streaming=streaming
        )
        sc.start()
        first = sc.finish_group("g0")
        second = sc.finish_group("g1")
        expected = [(0, Role.TRAINING)]
        assert (transitions(first), transitions(second)) == (
            (expected, []) if joins_after == "g0" else ([], expected)
        ), streaming
