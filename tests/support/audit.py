"""The invariants of a finished run, from `gyre audit` (app/audit/): what the fault suite, the resume test
and the end-to-end tests assert about a run, instead of the events its services published about themselves.

    report = assert_audited(config.run.path)

Passes when the replayed training equals the run's weights at every recorded step (within the audit's
tolerance), every micro-step holds what the packer must have made of its groups and its gradient from the
trainer's loss equals that of the audit's own objective, every group was trained at most once, every
dispatched execution is in exactly one terminal state with none lost, and the ledger and the accounting
equal the run's own report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.audit import AuditReport, audit_run
from app.audit.replay import TOLERANCE


def assert_audited(run_dir: Path, *, steps: int | None = None, probe: bool = False) -> AuditReport:
    report = audit_run(run_dir, probe=probe)
    summary = report.to_json()
    print(json.dumps({k: summary[k] for k in ("ok", "defects", "ledger", "accounting")}, indent=1))
    assert report.ok, report.defects
    replay = summary["replay"]
    assert not replay["skipped"], replay["skipped"]
    if steps is not None:
        assert replay["steps"] == steps and summary["ledger"]["steps"] == steps, summary
    assert all(d is not None and d <= TOLERANCE for d in replay["max_rel_diff_by_step"]), replay
    assert summary["ledger"]["matches_report"] is True
    objective = summary["objective"]
    assert not objective["skipped"] and objective["gradients_compared"] == objective["microsteps"], objective
    accounting = summary["accounting"]
    assert accounting["matches_report"] is True and accounting["lost"] == 0
    assert accounting["dispatched"] == accounting["counters"]["d"] > 0
    return report


def assert_every_execution_ended_ok(events: list[dict[str, Any]]) -> None:
    """From a run's stored events: every started execution terminated, each completed or cancelled (what a
    harness saw go wrong is any other ending)."""
    started = {
        e["event"]["execution"]["executionId"] for e in events if e["type"] == "gyre.v1.ExecutionStarted"
    }
    terminated = [e["event"] for e in events if e["type"] == "gyre.v1.ExecutionTerminated"]
    assert started <= {t["execution"]["executionId"] for t in terminated}
    assert all(
        t.get("reason") in ("TERMINATION_REASON_COMPLETED", "TERMINATION_REASON_CANCELLED")
        for t in terminated
    ), [t for t in terminated if t.get("reason") != "TERMINATION_REASON_COMPLETED"]
