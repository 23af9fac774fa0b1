"""Bus events → policy events: the start/termination bookkeeping around commanded starts."""

from __future__ import annotations

import math

from gyre.ids import batch_id
from gyre.v1 import common_pb2
from gyre.v1 import events_pb2 as ev
from services.scheduler.naming import engine_id
from services.scheduler.persist import ShellState
from services.scheduler.policy import ExecutionStarted, ExecutionTerminated
from services.scheduler.translate import EventTranslator


def _ref(eid: str) -> common_pb2.ExecutionRef:
    return common_pb2.ExecutionRef(execution_id=eid)


def _apply(makes: list, now: float = 1.0) -> list:
    return [e for e in (make(now) for make in makes) if e is not None]


def test_a_start_reported_before_the_command_is_recorded_is_not_counted_twice() -> None:
    commanded: dict[str, int] = {}
    t = EventTranslator(ShellState(commanded=commanded))
    # The runner's ExecutionStarted arrives while the executor is still awaiting the enqueue ...
    started = t.translate(ev.ExecutionStarted(execution=_ref("g1-e0"), engine_id=engine_id(2)))
    commanded["g1-e0"] = 2  # ... which then records the command; the driver applies the event after.
    assert _apply(started) == [ExecutionStarted(1.0, "g1-e0", 2)]
    assert commanded == {}
    ended = t.translate(
        ev.ExecutionTerminated(execution=_ref("g1-e0"), reason=common_pb2.TERMINATION_REASON_COMPLETED)
    )
    assert _apply(ended) == [ExecutionTerminated(1.0, "g1-e0", "TERMINATION_REASON_COMPLETED")]


def test_a_start_is_placed_on_the_engine_the_policy_commanded() -> None:
    # A restarted scheduler may command a start twice with different engines; the runner ran the first.
    t = EventTranslator(ShellState(commanded={"g1-e0": 1}))
    started = t.translate(ev.ExecutionStarted(execution=_ref("g1-e0"), engine_id=engine_id(2)))
    assert _apply(started) == [ExecutionStarted(1.0, "g1-e0", 1)]


def test_a_termination_without_a_reported_start_confirms_the_commanded_start_first() -> None:
    commanded = {"g1-e1": 0}
    t = EventTranslator(ShellState(commanded=commanded))
    ended = t.translate(
        ev.ExecutionTerminated(execution=_ref("g1-e1"), reason=common_pb2.TERMINATION_REASON_INFRA_FAILURE)
    )
    assert _apply(ended) == [
        ExecutionStarted(1.0, "g1-e1", 0),
        ExecutionTerminated(1.0, "g1-e1", "TERMINATION_REASON_INFRA_FAILURE"),
    ]
    assert commanded == {}


def test_the_step_reward_is_the_packed_batch_reward_once_the_step_completes() -> None:
    t = EventTranslator(ShellState())
    t.translate(ev.StreamClosed(batch_id=batch_id("run", 0), num_groups=4, mean_reward=0.375))
    assert math.isnan(t.last_step_reward)
    t.translate(ev.StepCompleted(policy_version=1))
    assert t.last_step_reward == 0.375
    t.translate(ev.StepCompleted(policy_version=2))  # no batch reward known for it: keeps the last
    assert t.last_step_reward == 0.375
