"""The simulator: deterministic, accounts for every execution, and the policy's invariants hold
after every event on random small clusters (hypothesis)."""

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.metrics.timeline import DRAINING, RETURNING
from services.scheduler.policy import Mode, Role
from sim.layout import Layout
from sim.presets import PRESETS
from sim.simulation import Simulation

NL2REPO = PRESETS["nl2repo-122b"]


def test_same_seed_same_run_and_another_seed_another_run():
    layout = Layout.default(NL2REPO, Mode.ELASTIC)
    first = Simulation(NL2REPO, layout, steps=6, seed=3).run().to_json()
    again = Simulation(NL2REPO, layout, steps=6, seed=3).run().to_json()
    other = Simulation(NL2REPO, layout, steps=6, seed=4).run().to_json()
    for result in (first, again, other):
        result.pop("wall_s")
    assert first == again
    assert first["total_h"] != other["total_h"]


def test_every_consumed_group_was_dispatched_and_fully_run():
    result = Simulation(NL2REPO, Layout.default(NL2REPO, Mode.ELASTIC), steps=6, seed=0).run()
    assert len(result.staleness) == 6 * NL2REPO.batch_groups
    assert len({r.group_id for r in result.staleness}) == len(result.staleness)
    assert result.executions_finished >= len(result.staleness) * NL2REPO.group_size
    assert result.executions_dispatched >= result.executions_started >= result.executions_finished
    assert len(result.step_end_s) == 6 and result.step_end_s == sorted(result.step_end_s)


def test_elastic_timeline_joins_core_first_in_index_order_and_returns_at_burst_end():
    result = Simulation(
        NL2REPO, Layout.default(NL2REPO, Mode.ELASTIC), steps=12, seed=0, record_timeline=True
    ).run()
    timeline = result.timeline
    assert timeline is not None and len(timeline.publish_s) == 3  # the run stops at the 12th step
    burst_ends = [result.step_end_s[i] for i in range(2, 12, 3)]
    starts = [0.0, *timeline.publish_s]
    for start, end in zip(starts, burst_ends, strict=True):
        joins = sorted(
            (t0, cell) for cell, t0, _, state in timeline.segments if state == DRAINING and start <= t0 < end
        )
        cells = [cell for _, cell in joins]
        assert cells == list(range(len(cells))) and len(cells) >= 2, cells
        if end < result.step_end_s[-1]:
            returns = {cell for cell, t0, _, state in timeline.segments if state == RETURNING and t0 == end}
            assert set(cells[1:]) <= returns  # every satellite goes back at the burst end


def _small_preset(group_size: int, batch_groups: int):
    return dataclasses.replace(
        NL2REPO,
        group_size=group_size,
        batch_groups=batch_groups,
        executions_per_node=2,
        num_nodes=0,
        rho_min=0.5,
        tau_s=30.0,
    )


@st.composite
def small_layouts(draw):
    mode = draw(st.sampled_from(list(Mode)))
    batch_groups = draw(st.integers(1, 4))
    cells = draw(st.integers(2, 4))
    layout = Layout(
        mode,
        num_cells=cells,
        cell_nodes=draw(st.integers(1, 3)),
        phi=draw(st.integers(0, 2 * batch_groups)) / batch_groups,
        mu=draw(st.integers(1, 3)),
        streaming=draw(st.booleans()),
        separate_pool_nodes=draw(st.integers(0, 2)),
        async_training_cells=draw(st.integers(1, cells - 1)) if mode is Mode.ASYNC else 0,
    )
    return _small_preset(draw(st.integers(1, 4)), batch_groups), layout


@settings(max_examples=40, deadline=None)
@given(small_layouts(), st.integers(0, 3))
def test_policy_invariants_hold_after_every_event(case, seed):
    preset, layout = case
    simulation = Simulation(preset, layout, steps=2 * layout.mu, seed=seed)
    policy = simulation.policy
    handle = policy.handle

    def checked(event):
        before = policy.state.dispatched - policy.state.finished
        actions = handle(event)
        s = policy.state
        assert s.dispatched >= s.started >= s.finished >= 0
        running = s.started - s.finished
        assert running <= s.placement.rollout_capacity
        loads = s.placement.loads()
        assert sum(loads.values()) == running
        assert all(loads[c] == 0 for c, r in enumerate(s.roles) if r is not Role.ROLLOUT)
        if type(event).__name__ not in ("RunStarted", "WeightsPublished"):
            assert s.dispatched - s.finished <= before  # the waterlevel never rises inside a burst
        training = [c for c, r in enumerate(s.roles) if r in (Role.TRAINING, Role.DRAINING)]
        if layout.mode is Mode.ELASTIC:
            assert training == list(range(len(training)))  # a prefix
            assert sum(r is Role.DRAINING for r in s.roles) <= 1  # serial
        if layout.mode is Mode.ASYNC and s.run_started:
            assert training == list(range(layout.async_training_cells))
        return actions

    policy.handle = checked
    result = simulation.run()
    assert len(result.step_end_s) == 2 * layout.mu
    assert len(result.staleness) == 2 * layout.mu * preset.batch_groups
