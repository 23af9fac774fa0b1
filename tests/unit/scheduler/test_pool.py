"""A pool that changes while the run goes on: cells join, leave with notice and are lost, on
hand-computed scenarios (the random ones are in tests/unit/sim/test_pool.py)."""

import json

import pytest

from services.scheduler.policy import (
    CellReady,
    DispatchGroups,
    EndBurst,
    LoadWeights,
    Mode,
    Policy,
    PublishWeights,
    ReleaseMicroSteps,
    RemoveCell,
    RerouteExecutions,
    RestoreCore,
    Role,
    TransitionCompleted,
    state_from_dict,
    state_to_dict,
)
from tests.unit.scheduler.scenario import Scenario, of_type, starts, transitions

R, D, T, J, G = Role.ROLLOUT, Role.DRAINING, Role.TRAINING, Role.JOINING, Role.GONE


def test_a_joining_cell_serves_only_once_it_holds_the_published_weights():
    # K=2, C_e=2, N=1, B=2, φ=2, μ=1: 6 executions, C_R = 4: cell 1 g0 g1, cell 0 g2 g3, g4 g5 queued.
    sc = Scenario(num_cells=2, cell_capacity=2, group_size=1, batch_groups=2, phi=2.0, mu=1)
    sc.start()
    assert sc.join(2) == [LoadWeights(2, 0)]
    snap = sc.snapshot
    assert (snap.roles, snap.num_cells, snap.cells_joining, snap.rollout_capacity) == ((R, R, J), 2, 1, 4)
    with pytest.raises(ValueError, match="next cell id, 3"):
        sc.join(5)
    actions = sc.cell_ready(2, 0)
    assert starts(actions) == [(2, 2)]  # the queued executions start on it: first in the reroute order
    assert sc.snapshot.members == (0, 1, 2) and sc.snapshot.rollout_capacity == 6
    # Eq. 2 reads the pool as it is now: w ≤ C_R − C_e = 4 (on the old pool it would take w ≤ 2).
    sc.terminate("g0.0")
    assert transitions(sc.ready("g0")) == []  # w = 5
    assert transitions(sc.terminate("g1.0")) == [(0, Role.TRAINING)]  # w = 4


def test_a_cell_ready_with_weights_older_than_a_publication_loads_again():
    sc = Scenario(num_cells=2, cell_capacity=4, group_size=1, batch_groups=1, phi=0.0, mu=1)
    sc.start()
    assert sc.join(2) == [LoadWeights(2, 0)]
    sc.finish_group("g0")
    sc.transitioned(0, Role.TRAINING)
    assert PublishWeights(1) in sc.train_batch(0, ["g0"])
    assert sc.cell_ready(2, 0) == [LoadWeights(2, 1)]  # version 1 went out while it loaded 0
    assert sc.snapshot.roles[2] is J
    sc.cell_ready(2, 1)
    assert sc.snapshot.roles[2] is R and sc.snapshot.members == (0, 1, 2)


def test_a_rollout_cell_leaving_with_notice_moves_its_executions_and_goes():
    # K=3, C_e=2, N=1, B=2, φ=2, μ=2: 8 executions, C_R = 6: cell 2 g0 g1, cell 1 g2 g3, cell 0 g4 g5.
    sc = Scenario(num_cells=3, cell_capacity=2, group_size=1, batch_groups=2, phi=2.0, mu=2)
    sc.start()
    actions = sc.leave(1)
    # Every engine is full: the executions go beyond capacity, in reroute order, KV migrated.
    assert of_type(actions, RerouteExecutions) == [
        RerouteExecutions(1, 2, ("g2.0",)),
        RerouteExecutions(1, 0, ("g3.0",)),
    ]
    assert of_type(actions, RemoveCell) == [RemoveCell(1, lost=False)]
    snap = sc.snapshot
    assert (snap.roles, snap.members, snap.rollout_capacity, snap.running) == ((R, G, R), (0, 2), 4, 6)
    assert snap.engine_loads == {-1: 0, 0: 3, 1: 0, 2: 3}
    # Over capacity nothing starts: two queued executions wait until running < C_R.
    assert starts(sc.terminate("g0.0", "g1.0")) == []  # running 4 = C_R
    assert starts(sc.terminate("g2.0")) == [(2, 1)]


def test_a_lost_rollout_cell_is_rerouted_to_recompute_and_counted():
    sc = Scenario(num_cells=3, cell_capacity=2, group_size=1, batch_groups=2, phi=1.0, mu=2)
    sc.start()  # 6 executions fill C_R = 6
    actions = sc.lose(2)
    assert of_type(actions, RerouteExecutions) == [
        RerouteExecutions(2, 1, ("g0.0",), recompute=True),
        RerouteExecutions(2, 0, ("g1.0",), recompute=True),
    ]
    assert of_type(actions, RemoveCell) == [RemoveCell(2, lost=True)]
    assert sc.snapshot.cells_lost == 1 and sc.snapshot.num_cells == 2
    assert sc.lose(2) == []  # a redelivered loss changes nothing


def _two_training_cells() -> Scenario:
    # K=3, C_e=8, N=1, B=4, φ=0, μ=1, ρ_min·B = 1: 4 executions on cell 2; cells 0 and 1 join training.
    sc = Scenario(num_cells=3, cell_capacity=8, group_size=1, batch_groups=4, phi=0.0, mu=1, rho_min=0.25)
    sc.start()
    sc.finish_group("g0")
    sc.transitioned(0, Role.TRAINING)
    sc.transitioned(1, Role.TRAINING)
    assert sc.snapshot.roles == (T, T, R)
    return sc


def test_a_training_satellite_leaving_releases_its_micro_steps():
    sc = _two_training_cells()
    sc.pack("g0", 0)
    sc.claim(1, 0, "g0")
    assert sc.snapshot.ready_unclaimed == 0 and sc.snapshot.batch_claimed == 1
    actions = sc.leave(1)
    assert actions == [ReleaseMicroSteps(1, 0), RemoveCell(1, lost=False)]
    snap = sc.snapshot
    assert (snap.ready_unclaimed, snap.batch_claimed, snap.claimable_groups) == (1, 0, 1)
    assert sc.policy.state.microsteps_in_flight == 0
    assert sc.done(1, 0) == []  # its late report changes nothing
    sc.claim(0, 0, "g0")  # the core takes the released micro-step
    assert sc.snapshot.batch_claimed == 1
    sc.done(0, 0)
    with pytest.raises(ValueError, match="cell 0 finished a micro-step that was never claimed"):
        sc.done(0, 0)


def _all_finished(sc: Scenario) -> None:
    for group in ("g1", "g2", "g3"):
        sc.finish_group(group)
    sc.transitioned(2, Role.TRAINING)  # w = 0: the last cell joined too


def test_the_training_core_hands_over_at_the_next_step_boundary():
    sc = _two_training_cells()
    assert sc.leave(0) == []  # it trains on: the hand-over waits for the step boundary
    _all_finished(sc)
    actions = sc.train_batch(0, ["g0", "g1", "g2", "g3"], cell=0)
    # The step ends the burst: the core goes, cell 1 (training) is the core, restores the handed-over
    # state (no step to take again) and only then publishes; it stays in training to do so.
    assert RemoveCell(0, lost=False) in actions and EndBurst(1) in actions
    assert of_type(actions, RestoreCore) == [RestoreCore(1, from_version=1, version=1)]
    assert of_type(actions, PublishWeights) == [] and transitions(actions) == [(2, Role.ROLLOUT)]
    assert sc.snapshot.members == (1, 2) and sc.snapshot.steps_lost == 0
    assert sc.restored(1, 1) == [PublishWeights(1)]
    assert DispatchGroups(num_groups=4, group_size=1, policy_version=1) in sc.published(1)


def test_a_lost_core_is_replaced_from_its_newest_checkpoint_and_the_lost_steps_are_counted():
    # μ = 2: the core takes step 0, then dies before a checkpoint covers it.
    sc = Scenario(num_cells=3, cell_capacity=8, group_size=1, batch_groups=2, phi=0.0, mu=2, rho_min=0.5)
    sc.start()
    sc.finish_group("g0")
    sc.transitioned(0, Role.TRAINING)
    sc.transitioned(1, Role.TRAINING)
    sc.finish_group("g1")
    sc.train_batch(0, ["g0", "g1"], cell=0)
    sc.checkpoint(0)
    actions = sc.lose(0)
    assert of_type(actions, RemoveCell) == [RemoveCell(0, lost=True)]
    assert of_type(actions, RestoreCore) == [RestoreCore(1, from_version=0, version=1)]
    assert sc.snapshot.steps_lost == 1 and sc.snapshot.members == (1, 2)
    sc.finish_group("g2")
    sc.finish_group("g3")
    with pytest.raises(ValueError, match="while a new core restores version 1"):
        sc.train_batch(1, ["g2", "g3"], cell=1)
    sc.restored(1, 1)
    assert PublishWeights(2) in sc.step(2)
    with pytest.raises(ValueError, match="checkpoint of version 5"):
        sc.checkpoint(5)


def test_a_lost_core_that_was_publishing_is_republished_by_its_successor():
    sc = _two_training_cells()
    _all_finished(sc)
    sc.train_batch(0, ["g0", "g1", "g2", "g3"], cell=0)  # no group ready for the next batch: all return
    for cell in range(3):
        sc.transitioned(cell, Role.ROLLOUT)
    sc.checkpoint(1)
    actions = sc.lose(0)  # publication of version 1 still pending
    # The new core (cell 1, in rollout) moves to training at once (Eq. 2: w = 0) to restore and publish.
    assert transitions(actions) == [(1, Role.TRAINING)]
    assert sc.snapshot.steps_lost == 0
    assert sc.transitioned(1, Role.TRAINING) == [RestoreCore(1, 1, 1)]
    assert sc.restored(1, 1) == [PublishWeights(1)]
    with pytest.raises(ValueError, match="RestoreCore went to None"):
        sc.restored(1, 1)


def test_running_executions_left_without_any_engine_bring_the_last_training_cell_back():
    sc = Scenario(num_cells=2, cell_capacity=4, group_size=1, batch_groups=2, phi=0.0, mu=1)
    sc.start()  # g0 g1 on cell 1
    sc.finish_group("g0")
    sc.transitioned(0, Role.TRAINING)
    actions = sc.lose(1)
    assert of_type(actions, RerouteExecutions) == []  # nowhere to go: orphaned, still running
    assert transitions(actions) == [(0, Role.ROLLOUT)]
    assert sc.snapshot.orphaned_executions == 1 and sc.snapshot.running == 1
    actions = sc.transitioned(0, Role.ROLLOUT)
    assert actions[0] == RerouteExecutions(1, 0, ("g1.0",), recompute=True)
    assert sc.snapshot.orphaned_executions == 0 and sc.snapshot.engine_loads[0] == 1


def test_a_leaving_core_is_not_brought_back_to_serve_orphans_a_new_cell_adopts_them():
    sc = Scenario(num_cells=2, cell_capacity=4, group_size=1, batch_groups=2, phi=0.0, mu=1)
    sc.start()
    sc.finish_group("g0")
    sc.transitioned(0, Role.TRAINING)
    sc.leave(0)  # it trains to its step boundary
    assert transitions(sc.lose(1)) == []  # the only other cell, with g1.0: orphaned, and the core is going
    assert sc.snapshot.orphaned_executions == 1
    sc.join(2)
    actions = sc.cell_ready(2, 0)
    assert of_type(actions, RerouteExecutions) == [RerouteExecutions(1, 2, ("g1.0",), recompute=True)]


def test_eq3_reads_the_pool_as_it_is_now():
    def burst_end(lose_cell_one: bool) -> list:
        # K=3, C_e=2, N=1, B=1, μ=1, φ=3: cell 2 g0 g1, cell 1 g2 g3. At the burst end w = 2 and
        # w + μNB = 3 ≤ (K − 1)·C_e = 4 keeps the core; with cell 1 lost, (K − 1)·C_e = 2 does not.
        sc = Scenario(num_cells=3, cell_capacity=2, group_size=1, batch_groups=1, phi=3.0, mu=1)
        sc.start()
        sc.finish_group("g0")
        sc.transitioned(0, Role.TRAINING)
        sc.pack("g0", 0)
        sc.claim(0, 0, "g0")
        sc.finish_group("g1")  # ready for the next batch
        if lose_cell_one:
            sc.lose(1)
        sc.close(0, 1)
        sc.done(0, 0)
        return sc.step(1)

    assert transitions(burst_end(lose_cell_one=False)) == []
    assert transitions(burst_end(lose_cell_one=True)) == [(0, Role.ROLLOUT)]


def test_async_keeps_its_training_cells_through_losses():
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
    sc.start()  # cell 0 trains; g0 g1 on cell 2
    sc.transitioned(0, Role.TRAINING)
    actions = sc.lose(0)
    # Cell 1 (empty) replaces it and, as the new core, restores the state (nothing was stepped yet).
    assert transitions(actions) == [(1, Role.TRAINING)]
    assert sc.transitioned(1, Role.TRAINING) == [RestoreCore(1, 0, 0)]
    sc.restored(1, 0)
    assert sc.join(3) == [LoadWeights(3, 0)]
    assert transitions(sc.lose(1)) == []  # cell 2 is the last engine that serves: it stays
    actions = sc.cell_ready(3, 0)
    assert transitions(actions) == [(3, Role.TRAINING)]  # the new cell fills the training side
    assert sc.snapshot.members == (3, 2)
    assert sc.transitioned(3, Role.TRAINING) == [RestoreCore(3, 0, 0)]


def test_pool_events_about_unknown_cells_or_out_of_turn_are_rejected_and_late_ones_ignored():
    sc = Scenario(num_cells=2, cell_capacity=4, group_size=1, batch_groups=1, phi=0.0, mu=1)
    sc.start()
    with pytest.raises(ValueError, match="unknown cell 9"):
        sc.leave(9)
    with pytest.raises(ValueError, match="ready while rollout"):
        sc.cell_ready(0, 0)
    sc.finish_group("g0")  # the core starts draining
    assert sc.snapshot.roles == (D, R)
    # Its successor is the core; w = 0 ≤ C_R − C_e and g0 is ready: it joins training (and will restore).
    assert transitions(sc.lose(0)) == [(1, Role.TRAINING)]
    assert sc.transitioned(0, Role.TRAINING) == []  # the lost cell's drain finished after it was gone
    assert sc.snapshot.roles == (G, D) and sc.snapshot.members == (1,)
    assert sc.transitioned(1, Role.TRAINING) == [RestoreCore(1, 0, 0)]


def _round_trip(sc: Scenario) -> Policy:
    data = json.loads(json.dumps(state_to_dict(sc.policy.state)))
    restored = Policy(sc.params, state_from_dict(sc.params, data))
    assert restored.snapshot() == sc.snapshot
    return restored


def test_a_restarted_scheduler_resumes_a_changed_pool_exactly():
    sc = Scenario(num_cells=3, cell_capacity=2, group_size=1, batch_groups=2, phi=2.0, mu=2)
    sc.start()
    sc.join(3)
    sc.lose(1)  # over capacity: its executions recompute on cells 2 and 0
    restored = _round_trip(sc)
    event = CellReady(sc.now, 3, 0)
    assert restored.handle(event) == sc.policy.handle(event)
    # Orphaned executions and a core on its way back survive a restart too.
    sc = Scenario(num_cells=2, cell_capacity=4, group_size=1, batch_groups=2, phi=0.0, mu=1)
    sc.start()
    sc.finish_group("g0")
    sc.transitioned(0, Role.TRAINING)
    sc.lose(1)
    restored = _round_trip(sc)
    event = TransitionCompleted(sc.now, 0, Role.ROLLOUT)
    assert restored.handle(event) == sc.policy.handle(event) != []


def test_a_stored_state_of_format_2_a_fixed_pool_is_read():
    sc = Scenario(num_cells=3, cell_capacity=2, group_size=1, batch_groups=2, phi=2.0, mu=2)
    sc.start()
    sc.finish_group("g0")  # the core drains: its reservation-free executions moved
    data = json.loads(json.dumps(state_to_dict(sc.policy.state)))
    placement = data["placement"]
    pool_last = {k: placement[k][1:] + placement[k][:1] for k in ("serving", "load", "unbound", "members")}
    pool_last["forward"] = [
        [3 if x == 0 else x - 1 for x in f] for f in placement["forward"][1:] + placement["forward"][:1]
    ]
    old = {k: v for k, v in data.items() if k in _FORMAT_2_KEYS} | {"format": 2, "placement": pool_last}
    restored = Policy(sc.params, state_from_dict(sc.params, old))
    assert restored.snapshot() == sc.snapshot
    with pytest.raises(ValueError, match="format 1"):
        state_from_dict(sc.params, old | {"format": 1})


_FORMAT_2_KEYS = [
    "roles",
    "dispatched",
    "started",
    "finished",
    "version",
    "published_version",
    "burst_start_version",
    "burst",
    "run_started",
    "pending_publications",
    "batch_step",
    "batch_packed",
    "batch_claimed",
    "batch_stream_closed",
    "batch_unclaimed",
    "ready_unclaimed",
    "groups",
    "staleness",
    "supply_since_s",
    "microsteps_in_flight",
    "transitions_completed",
    "tick_at_s",
    "now_s",
]
