"""The fault suite's invariants (app/demo/ledger.py) catch what they claim to: a lost execution, a group
trained by two steps, a micro-step applied twice, a version skipped; a replayed step is not a double."""

from __future__ import annotations

from typing import Any

from app.demo.ledger import check_events


def _e(kind: str, t: float, **event: Any) -> dict[str, Any]:
    return {"type": f"gyre.v1.{kind}", "time_s": t, "event": event, "subject": ""}


def _run(extra: list[dict[str, Any]] | None = None, steps: int = 2) -> list[dict[str, Any]]:
    events = []
    for g in range(2):
        ids = [f"g{g}-e0", f"g{g}-e1"]
        events.append(_e("GroupDispatched", 1.0, groupId=f"g{g}", executionIds=ids))
        for eid in ids:
            events += [
                _e("ExecutionStarted", 2.0, execution={"executionId": eid}),
                _e(
                    "ExecutionTerminated",
                    3.0,
                    execution={"executionId": eid},
                    reason="TERMINATION_REASON_COMPLETED",
                ),
                _e("EvaluationDone", 4.0, execution={"executionId": eid}, status="EVALUATION_STATUS_VALID"),
            ]
    for s in range(steps):
        events += [
            _e("GroupPacked", 5.0 + s, batchId=f"r-b{s}", groupId=f"g{s}"),
            _e("StepCompleted", 6.0 + s, batchId=f"r-b{s}", policyVersion=str(s + 1), microstepIds=[f"m{s}"]),
        ]
    return events + (extra or [])


def test_a_clean_run_keeps_every_invariant() -> None:
    check = check_events(_run(), steps=2)
    assert check.completed and check.violations == [] and check.group_ledger == {"g0": [1], "g1": [2]}


def test_a_replayed_step_is_one_step() -> None:
    replay = _e("StepCompleted", 9.0, batchId="r-b1", policyVersion="2", microstepIds=["m1"], replayed=True)
    check = check_events(_run([replay]), steps=2)
    assert check.violations == [] and check.replayed_steps == 1


def test_violations_are_found() -> None:
    extra = [
        _e("GroupPacked", 9.0, batchId="r-b1", groupId="g0"),  # g0 trained again in v2
        _e(
            "StepCompleted", 9.5, batchId="r-b2", policyVersion="4", microstepIds=["m0"]
        ),  # v3 skipped, m0 again
        _e("GroupDispatched", 10.0, groupId="g9", executionIds=["g9-e0"]),
        _e("ExecutionStarted", 10.5, execution={"executionId": "g9-e0"}),  # never terminated
    ]
    check = check_events(_run(extra), steps=2)
    assert check.double_trained == 1 and check.double_applied == 1 and check.lost == 1
    assert check.count("version") == 2 and not check.completed
