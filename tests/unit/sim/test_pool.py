"""A pool that changes while the run goes on, in the simulator: every invariant of the policy holds under
random joins, notices and losses interleaved with the normal events (hypothesis), and the scenarios'
costs and counts are accounted."""

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from services.scheduler.policy import Mode
from sim.layout import Layout
from sim.pool import JOIN, LEAVE, LOSE, POOLS, PoolScenario, PoolSchedule
from sim.presets import PRESETS
from sim.simulation import Simulation
from tests.unit.scheduler.invariants import watch
from tests.unit.sim.cases import small_layouts

NL2REPO = PRESETS["nl2repo-122b"]


@st.composite
def churning_pools(draw):
    """Reclaims, failures and growth at rates that change a small cluster several times a run; what
    leaves comes back (else async, which needs a rollout cell and a training cell, could stall)."""
    return PoolScenario(
        "random",
        "hypothesis",
        reclaims_per_cell_h=draw(st.sampled_from([0.0, 0.2, 1.0])),
        notice_s=draw(st.sampled_from([10.0, 120.0, 3600.0])),
        return_after_h=draw(st.sampled_from([0.0, 0.5, 2.0])),
        failures_per_node_h=draw(st.sampled_from([0.0, 0.05, 0.2])),
        replace_after_h=draw(st.sampled_from([0.0, 1.0])),
        grow_cells=draw(st.sampled_from([0.0, 0.5, 1.0])),
        grow_from_h=draw(st.sampled_from([0.0, 1.0])),
        min_cells=draw(st.integers(1, 2)),
        cell_start_s=draw(st.sampled_from([1.0, 300.0])),
        checkpoint_s=draw(st.sampled_from([0.0, 600.0, 7200.0])),
        restart_s=draw(st.sampled_from([0.0, 900.0])),
    )


@settings(max_examples=150, deadline=None)
@given(small_layouts(), churning_pools(), st.integers(0, 3))
def test_policy_invariants_hold_while_cells_join_leave_and_are_lost(case, pool, seed):
    preset, layout = case
    simulation = Simulation(preset, layout, steps=2 * layout.mu, seed=seed, pool=pool)
    watch(simulation.policy, fixed_pool=False)
    result = simulation.run()
    assert len(result.step_end_s) == 2 * layout.mu
    assert len(result.staleness) == 2 * layout.mu * preset.batch_groups
    assert len({r.group_id for r in result.staleness}) == len(result.staleness)  # no group trained twice
    s = simulation.policy.state
    assert result.pool.cells_left == s.cells_left and result.pool.cells_lost == s.cells_lost
    assert result.pool.cells_joined == s.cells_joined
    if layout.mode is Mode.ELASTIC or pool.restart_s == 0:
        assert result.pool.restarts == 0
    else:
        assert result.pool.restarts == result.pool.cells_lost


def test_removals_come_at_the_same_times_for_every_mode():
    schedules = [PoolSchedule(POOLS["spot"], num_cells=8, cell_nodes=4, seed=1) for _ in range(2)]
    first = [schedules[0].pop() for _ in range(20)]
    assert first == [schedules[1].pop() for _ in range(20)]
    assert all(kind == LEAVE for _, kind, _ in first) and first == sorted(first)
    other = PoolSchedule(POOLS["spot"], num_cells=8, cell_nodes=4, seed=2)
    assert [other.pop() for _ in range(20)] != first
    grow = PoolSchedule(POOLS["grow"], num_cells=8, cell_nodes=4, seed=0)
    assert [grow.pop()[:2] for _ in range(4)] == [(h * 3600.0, JOIN) for h in (2.0, 3.0, 4.0, 5.0)]
    assert grow.next_s == float("inf")
    failures = PoolSchedule(POOLS["failures"], num_cells=8, cell_nodes=4, seed=0)
    assert failures.pop()[1] == LOSE


def _run(mode: Mode, pool: PoolScenario, steps: int = 6):
    return Simulation(NL2REPO, Layout.default(NL2REPO, mode), steps=steps, seed=0, pool=pool).run()


def test_capacity_hours_integrate_the_pool_size():
    fixed = _run(Mode.ELASTIC, POOLS["fixed"])
    assert abs(fixed.pool.capacity_node_h - NL2REPO.num_nodes * fixed.total_h) < 1e-6
    grow = _run(Mode.ELASTIC, POOLS["grow"])
    assert grow.pool.cells_joined == 4
    assert NL2REPO.num_nodes * grow.total_h < grow.pool.capacity_node_h < 48 * grow.total_h
    out = grow.to_json()["pool"]
    assert out["mean_pool_nodes"] > NL2REPO.num_nodes
    assert out["steps_per_1k_node_h"] == round(1000 * 6 / grow.pool.capacity_node_h, 4)


def test_a_lost_cells_executions_pay_their_recompute_and_a_static_baseline_its_restart():
    failures = dataclasses.replace(POOLS["failures"], failures_per_node_h=1 / 50, replace_after_h=None)
    cheap = _run(Mode.ELASTIC, dataclasses.replace(failures, recompute_s=0.0))
    dear = _run(Mode.ELASTIC, dataclasses.replace(failures, recompute_s=3 * 3600.0))
    assert cheap.pool.cells_lost == dear.pool.cells_lost > 0 and dear.pool.recomputed_executions > 0
    assert dear.total_s > cheap.total_s and cheap.pool.restarts == dear.pool.restarts == 0
    static = _run(Mode.COLOCATE, failures)
    free = _run(Mode.COLOCATE, dataclasses.replace(failures, restart_s=0.0))
    assert static.pool.restarts == static.pool.cells_lost > 0 and free.pool.restarts == 0
    assert static.total_s > free.total_s


def test_a_spot_core_that_cannot_hand_over_within_its_notice_is_lost():
    # A notice shorter than a step: every reclaimed training core runs out of notice before its step
    # boundary; with a notice of hours it always hands over.
    short = _run(Mode.ASYNC, dataclasses.replace(POOLS["spot"], notice_s=1.0, reclaims_per_cell_h=0.5))
    long = _run(Mode.ASYNC, dataclasses.replace(POOLS["spot"], notice_s=10 * 3600.0, reclaims_per_cell_h=0.5))
    assert short.pool.cells_lost > 0
    assert long.pool.cells_lost == 0 and long.pool.cells_left > 0
