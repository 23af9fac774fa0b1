"""The policy's invariants, checked after every event it handles (`watch(policy)` wraps its `handle`).

Used by the simulator's property tests on a fixed pool (tests/unit/sim/test_simulation.py) and on pools
whose cells join, leave and are lost (tests/unit/sim/test_pool.py). K is always the pool as it is now.

- counters: d ≥ p ≥ f ≥ 0; the waterlevel w = d − f never rises but at a dispatch (RunStarted,
  WeightsPublished)
- placement: every running execution is on one engine (or orphaned, waiting for one), the engine the
  shell was told (ExecutionStarted, then every RerouteExecutions); only rollout engines hold any;
  running ≤ C_R, except that a pool event may leave running above a C_R it shrank, and then nothing
  starts
- the pool: the members are exactly the cells in a member role; RemoveCell names exactly the cells
  that went; no action sends work to a gone cell
- elastic: the training cells are a prefix of the members (core first), at most one drains (serial);
  async: the training cells are a prefix of at most T (exactly T on a fixed pool); while a new core
  restores, no other cell moves into training (but colocate's, which moves every cell with the core)
- elastic, colocate: every move into training by waterlevel control had Eq. 2 on the current pool, and
  the supply check held for τ; at a burst end the core stays exactly when the next batch has ρ_min·B
  ready groups and Eq. 3 holds on the current pool
- the core changes only when it is gone (or its successor was still to restore the state anyway); a lost
  core's lost steps are counted (version − its durable version) and its successor restores the durable
  version: never silent
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.scheduler.policy import (
    MEMBER_ROLES,
    BeginTransition,
    EndBurst,
    Engine,
    ExecutionStarted,
    ExecutionTerminated,
    Mode,
    Policy,
    RemoveCell,
    RerouteExecutions,
    Role,
    StartExecutions,
)
from services.scheduler.policy.supply import claimable_groups

_DISPATCHING = ("RunStarted", "WeightsPublished")


def watch(policy: Policy, *, fixed_pool: bool = True) -> Callable[[Any], list[Any]]:
    """Replace `policy.handle` by a version that checks every invariant after each event."""
    handle = policy.handle
    p = policy.params
    told: dict[str, Engine] = {}  # what the shell was told: each running execution's engine

    def checked(event: Any) -> list[Any]:
        s = policy.state
        w_before = s.dispatched - s.finished
        running_before = s.started - s.finished
        since_before = s.supply.since_s
        core_before, restoring_before = s.core, s.restore_from is not None
        core_trained = core_before is not None and s.roles[core_before] is Role.TRAINING
        version_before, durable_before, lost_before = s.version, s.durable_version, s.steps_lost
        present_before = {c for c, r in enumerate(s.roles) if r is not Role.GONE}
        actions = handle(event)
        s = policy.state
        name = type(event).__name__
        if isinstance(event, ExecutionStarted):
            told[event.execution_id] = event.engine
        elif isinstance(event, ExecutionTerminated):
            del told[event.execution_id]
        for a in actions:
            if isinstance(a, RerouteExecutions):
                for execution_id in a.execution_ids:
                    assert told[execution_id] == a.source, f"{execution_id} rerouted from {a.source}"
                    told[execution_id] = a.destination
        assert told == s.placement.assignments(), "the shell routes an execution elsewhere than placement"
        w = s.dispatched - s.finished

        assert s.dispatched >= s.started >= s.finished >= 0
        if name not in _DISPATCHING:
            assert w <= w_before, f"the waterlevel rose on {name}"  # never inside a burst

        running = s.started - s.finished
        capacity = s.placement.rollout_capacity
        loads = s.placement.loads()
        assert sum(loads.values()) + s.placement.orphaned == running
        assert all(loads[c] == 0 for c, r in enumerate(s.roles) if r is not Role.ROLLOUT)
        started = any(isinstance(a, StartExecutions) for a in actions)
        assert running <= max(capacity, running_before), f"{name} took running past C_R"
        assert running <= capacity or not started, "started executions while over capacity"

        members = [c for c, r in enumerate(s.roles) if r in MEMBER_ROLES]
        assert sorted(s.members) == members, f"members {s.members}, roles {s.roles}"
        gone = present_before - {c for c, r in enumerate(s.roles) if r is not Role.GONE}
        assert {a.cell for a in actions if isinstance(a, RemoveCell)} == gone
        gone_now = {c for c, r in enumerate(s.roles) if r is Role.GONE}
        for a in actions:
            if isinstance(a, StartExecutions | RerouteExecutions):
                engine = a.engine if isinstance(a, StartExecutions) else a.destination
                assert engine not in gone_now, f"{a} sends work to a gone cell"
            if isinstance(a, BeginTransition):
                assert a.cell not in gone_now

        training = [c for c in s.members if s.roles[c] in (Role.TRAINING, Role.DRAINING)]
        if s.restore_from is not None and p.mode is not Mode.COLOCATE:  # (colocate moves all, core too)
            moved = {a.cell for a in actions if isinstance(a, BeginTransition) and a.to_role is Role.TRAINING}
            assert moved <= {s.core}, f"{moved} moved into training while a new core restores"
        if p.mode is Mode.ELASTIC:
            assert training == s.members[: len(training)], f"not a prefix: {s.members} {s.roles}"
            assert sum(s.roles[c] is Role.DRAINING for c in s.members) <= 1  # serial
        if p.mode is Mode.ASYNC and s.run_started:
            assert training == s.members[: len(training)] and len(training) <= p.async_training_cells
            if fixed_pool:
                assert training == list(range(p.async_training_cells))

        if p.mode is not Mode.ASYNC:
            _check_waterlevel_moves(policy, actions, since_before, now_s=event.now_s)
            if core_trained and any(isinstance(a, EndBurst) for a in actions):
                _check_burst_end(policy)

        if s.core != core_before and core_before is not None:
            assert s.roles[core_before] is Role.GONE or restoring_before, (
                "the core changed hands without its state"
            )
        if core_before is not None and s.roles[core_before] is Role.GONE and not restoring_before:
            lost = any(isinstance(a, RemoveCell) and a.cell == core_before and a.lost for a in actions)
            expected = version_before - durable_before if lost else 0
            assert s.steps_lost - lost_before == expected, "a lost core's steps went uncounted"
            assert s.restore_from == (durable_before if lost else s.version)  # (a hand-over: its state)
        return actions

    policy.handle = checked  # type: ignore[method-assign]
    return checked


def _check_waterlevel_moves(
    policy: Policy, actions: list[Any], since_before: float | None, now_s: float
) -> None:
    s, p = policy.state, policy.params
    moved = [a.cell for a in actions if isinstance(a, BeginTransition) and a.to_role is Role.TRAINING]
    if not moved:
        return
    w = s.dispatched - s.finished
    assert w <= s.placement.rollout_capacity, f"Eq. 2 broken: w = {w}, C_R now {s.placement.rollout_capacity}"
    forced_core = s.restore_from is not None and moved == [s.core]  # a new core moved to restore and publish
    if not forced_core:
        claimable = claimable_groups(
            ready_unclaimed=s.ready_unclaimed,
            batch_needs=p.batch_groups - s.batch_claimed,
            streaming=p.streaming,
        )
        assert s.batch_step is not None and claimable >= p.supply_threshold, "joined without supply"
        assert p.tau_s == 0 or (since_before is not None and since_before + p.tau_s <= now_s), "τ not held"


def _check_burst_end(policy: Policy) -> None:
    s, p = policy.state, policy.params
    if s.restore_from is not None or s.core is None:
        return  # a restoring core stays to publish (membership.py)
    unit = len(s.members) if p.mode is Mode.COLOCATE else 1
    w = s.dispatched - s.finished
    ready = claimable_groups(
        ready_unclaimed=s.ready_unclaimed, batch_needs=p.batch_groups, streaming=p.streaming
    )
    eq3 = (
        w + p.burst_dispatch_groups * p.group_size
        <= p.separate_pool_capacity + (len(s.members) - unit) * p.cell_capacity
    )
    stayed = s.roles[s.core] is Role.TRAINING  # it trained to the burst's end: it stays or it returns
    assert stayed == (eq3 and ready >= p.supply_threshold), "Eq. 3 decided wrong"
