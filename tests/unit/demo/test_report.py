"""The run report: every dispatched execution accounted for once; reward and staleness per step."""

from __future__ import annotations

from app.demo.events import RecordedEvent
from app.demo.report import RunFacts, run_warnings, summarize, timeline, trained_nothing
from gyre.v1 import common_pb2 as common
from gyre.v1 import events_pb2 as ev

VALID, EXCLUDED, PLACEHOLDER = (
    common.EVALUATION_STATUS_VALID,
    common.EVALUATION_STATUS_EXCLUDED,
    common.EVALUATION_STATUS_PLACEHOLDER,
)


def _ref(eid: str) -> common.ExecutionRef:
    return common.ExecutionRef(execution_id=eid)


def _events() -> list[RecordedEvent]:
    out: list[ev.Message] = []  # type: ignore[name-defined]
    t = [0.0]

    def add(e: object) -> None:
        t[0] += 1.0
        out.append(RecordedEvent("s", t[0], e))  # type: ignore[arg-type]

    for g in ("g1", "g2", "g3"):
        add(ev.GroupDispatched(group_id=g, execution_ids=[f"{g}-e0", f"{g}-e1"]))
    for eid in ("g1-e0", "g1-e1", "g2-e0", "g2-e1", "g3-e0"):
        add(ev.ExecutionStarted(execution=_ref(eid)))
    add(ev.RoleTransitionBegun(cell=0, to_role=common.CELL_ROLE_TRAINING))
    add(ev.RoleTransitionCompleted(cell=0, to_role=common.CELL_ROLE_TRAINING, duration_s=0.4))
    outcomes = {"g1-e0": VALID, "g1-e1": EXCLUDED, "g2-e0": VALID, "g2-e1": PLACEHOLDER, "g3-e0": VALID}
    for eid, status in outcomes.items():
        add(ev.ExecutionTerminated(execution=_ref(eid), reason=common.TERMINATION_REASON_COMPLETED))
        add(ev.EvaluationDone(execution=_ref(eid), status=status, reward=1.0))
    add(ev.GroupReady(group_id="g1", mean_reward=1.0))
    add(ev.GroupReady(group_id="g2", mean_reward=0.5))
    add(ev.GroupPacked(batch_id="r-b0", group_id="g1", staleness=0))
    add(ev.MicroStepClaimed(cell=0, step=0))
    add(ev.MicroStepDone(cell=0, step=0))
    add(ev.StepCompleted(batch_id="r-b0", policy_version=1, loss=0.25))
    add(ev.GroupPacked(batch_id="r-b1", group_id="g2", staleness=1))
    add(ev.StepCompleted(batch_id="r-b1", policy_version=2, loss=0.125))
    add(ev.ExecutionTerminated(execution=_ref("g3-e1"), reason=common.TERMINATION_REASON_CANCELLED))
    add(ev.WeightsPublished(policy_version=2))
    return out


FACTS = RunFacts(
    mode="elastic",
    phi=0.5,
    mu=1,
    num_cells=2,
    group_size=2,
    cell_capacity=4,
    separate_pool_capacity=0,
    reroutes=3,
)


def test_every_execution_is_accounted_for_once() -> None:
    summary = summarize(_events(), FACTS)
    executions = summary["executions"]
    assert executions == {
        "dispatched": 6,
        "trained": 2,
        "excluded": 1,
        "placeholder": 1,
        "cancelled": 1,
        "unconsumed": 1,
    }
    assert summary["terminations"] == {"cancelled": 1, "completed": 5}


def test_reward_staleness_and_transitions() -> None:
    summary = summarize(_events(), FACTS)
    assert summary["steps"] == 2
    assert summary["reward_by_step"] == [1.0, 0.5]
    assert summary["staleness_by_step"] == [0, 1]
    assert summary["mean_staleness"] == 1  # steps after the first burst (μ = 1): step 1 only
    assert summary["target_staleness"] == 0.5
    assert summary["transitions"] == {"count": 1, "median_s_to_training": 0.4, "median_s_to_rollout": None}
    assert summary["loss_by_step"] == [0.25, 0.125]
    assert summary["reroutes"] == 3


def test_timeline_segments_follow_roles() -> None:
    tl = timeline(_events(), FACTS, "t")
    states_of_cell0 = [state for cell, _, _, state in sorted(tl.segments) if cell == 0]
    from gyre.metrics.timeline import DRAINING, ROLLOUT, TRAINING_BUSY, TRAINING_IDLE

    assert states_of_cell0 == [ROLLOUT, DRAINING, TRAINING_IDLE, TRAINING_BUSY, TRAINING_IDLE]
    assert tl.step_end_s and tl.publish_s
    final = tl.series[-1]
    assert final[1] == 6 - 6  # waterlevel d - f: every execution terminated


def test_a_healthy_run_has_no_warnings_and_counts_executions_without_targets() -> None:
    events = _events()
    for e in events:
        if isinstance(e.event, ev.StepCompleted):
            e.event.num_targets = 40
        if isinstance(e.event, ev.GroupPacked) and e.event.group_id == "g2":
            e.event.num_executions_without_targets = 1  # its placeholder
    summary = summarize(events, FACTS)
    assert summary["target_tokens_by_step"] == [40, 40]
    assert summary["executions_consumed"] == 4 and summary["executions_without_targets"] == 1
    assert summary["refused_calls"] == {} and run_warnings(summary) == [] and not trained_nothing(summary)


def test_a_run_that_trained_nothing_says_why() -> None:
    events = _events()
    for e in events:
        if isinstance(e.event, ev.GroupPacked):
            e.event.num_executions_without_targets = 2
    facts = RunFacts(
        mode="elastic",
        phi=0.5,
        mu=1,
        num_cells=2,
        group_size=2,
        cell_capacity=4,
        separate_pool_capacity=0,
        refused_calls={"prompt_too_long": 7},
        refusal_messages={"prompt_too_long": "prompt is too long: 49097 tokens > 4095 maximum"},
    )
    summary = summarize(events, facts)
    assert summary["target_tokens_by_step"] == [0, 0] and trained_nothing(summary)
    assert summary["refused_calls"] == {"prompt_too_long": 7}
    warnings = "\n".join(run_warnings(summary))
    assert "no optimizer step trained a token" in warnings
    assert "4 of 4 consumed executions (100%)" in warnings
    assert "prompt_too_long: 7 (latest: prompt is too long: 49097 tokens > 4095 maximum)" in warnings


def test_a_run_with_same_container_verifiers_names_them() -> None:
    summary = summarize(_events(), FACTS)
    assert not any("same_container" in w for w in run_warnings(summary))
    summary["same_container_verifier_tasks"] = ["tasks/fix-sum"]
    assert [w for w in run_warnings(summary) if "same_container" in w] == [
        "verified in the execution's own container (same_container: the harness could change the grader): "
        "tasks/fix-sum"
    ]
