"""Every dispatched execution in exactly one terminal state, from the records of the services that handled
it: the scheduler's dispatch records and counters, the runner's claim (how it says the execution ended),
the evaluator's evaluations and group outcomes, and the archive's trained batches.

    result = account_executions(data, trained_groups)      # trained_groups: the ledger's group → step

    trained      its group was trained by a recorded step and the evaluator resolved it valid
    excluded     … resolved it excluded
    placeholder  … resolved it a placeholder
    cancelled    the runner ended it as CANCELLED, or it never started and the scheduler had recorded
                 the run's stop (no dispatch or start after it) — a recorded decision cancelled it
    unconsumed   the runner ended it (any other reason), its group was not trained
    lost         anything else: dispatched and never started with no decision that cancelled it, claimed
                 by a runner that never ended it, or a member of a trained group the evaluator never resolved

Defects: each `lost` execution, and evidence that disagrees — a member of a trained group whose runner claim
is not done, an outcome that differs from the evaluator's first evaluation, the scheduler's counters against
the records (d against the dispatched executions, f against the finished claims). Then the counts are
compared with the run's own report (`summary.json` `executions`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from app.audit.data import GroupData, RunData
from gyre.v1 import common_pb2

STATES = ("trained", "excluded", "placeholder", "cancelled", "unconsumed", "lost")
_BY_STATUS = {"valid": "trained", "excluded": "excluded", "placeholder": "placeholder"}
_REASONS = {
    name.removeprefix("TERMINATION_REASON_")
    for name in common_pb2.TerminationReason.DESCRIPTOR.values_by_name
}


@dataclass(slots=True)
class AccountingResult:
    state: dict[str, str] = field(default_factory=dict)
    """Execution → its terminal state."""
    why: dict[str, str] = field(default_factory=dict)
    """Execution → what decided a `lost` or `cancelled` state."""
    counters: dict[str, int] = field(default_factory=dict)
    defects: list[str] = field(default_factory=list)
    matches_report: bool | None = None

    def counts(self) -> dict[str, int]:
        c = Counter(self.state.values())
        return {"dispatched": len(self.state), **{s: c.get(s, 0) for s in STATES}}

    def to_json(self) -> dict[str, Any]:
        return {
            **self.counts(),
            "counters": self.counters,
            "lost_executions": sorted(e for e, s in self.state.items() if s == "lost"),
            "matches_report": self.matches_report,
        }


def _claim(raw: str | None) -> tuple[str, str | None, str | None]:
    """(kind, runner, reason) of a runner claim: ("none"|"held"|"done", …)."""
    if raw is None:
        return "none", None, None
    if raw.startswith("done:"):
        runner, _, reason = raw.removeprefix("done:").rpartition(":")  # runner ids may hold colons
        if reason in _REASONS:
            return "done", runner, reason
        return "done", raw.removeprefix("done:"), None
    return "held", raw, None


def account_executions(data: RunData, trained_groups: dict[str, int]) -> AccountingResult:
    result = AccountingResult(counters=dict(data.counters))
    stopping = bool((data.scheduler_state or {}).get("shell", {}).get("stopping"))
    for gid, g in data.groups.items():
        trained = gid in trained_groups
        for eid in g.execution_ids:
            result.state[eid] = _state(eid, g, trained, stopping, result)
    bad = result.defects
    for eid, state in sorted(result.state.items()):
        if state == "lost":
            bad.append(f"execution {eid} lost: {result.why[eid]}")
    if data.counters:
        dispatched = len(result.state)
        finished = sum(
            1 for g in data.groups.values() for e in g.execution_ids if _claim(g.runner.get(e))[0] == "done"
        )
        if data.counters.get("d") != dispatched:
            bad.append(
                f"the scheduler counted d = {data.counters.get('d')} dispatched; the records hold {dispatched}"
            )
        if data.counters.get("f") != finished:
            bad.append(
                f"the scheduler counted f = {data.counters.get('f')} finished; the runner ended {finished}"
            )
    _compare_report(data, result)
    return result


def _state(eid: str, g: GroupData, trained: bool, stopping: bool, result: AccountingResult) -> str:
    kind, runner, reason = _claim(g.runner.get(eid))
    evaluations = g.evaluations.get(eid) or []
    status = g.outcome.get(eid)
    bad = result.defects
    if eid not in g.records:
        result.why[eid] = "its group lists it, but it has no execution record"
        return "lost"
    if trained:
        if status is None:
            result.why[eid] = f"its group {g.group_id} was trained, but the evaluator never resolved it"
            return "lost"
        if kind != "done":
            bad.append(
                f"execution {eid} was trained, but its runner claim is {g.runner.get(eid)!r}, not done"
            )
        if evaluations and str(evaluations[0].get("status")) != status:
            bad.append(
                f"execution {eid}: the group outcome says {status}, its evaluation {evaluations[0].get('status')}"
            )
        return _BY_STATUS.get(status, "lost")
    if kind == "done":
        if reason == "CANCELLED":
            result.why[eid] = f"the runner {runner} cancelled it"
            return "cancelled"
        return "unconsumed"
    if kind == "held":
        result.why[eid] = f"runner {runner} claimed it and never ended it"
        return "lost"
    if stopping:
        result.why[eid] = "never started: the scheduler had recorded the run's stop"
        return "cancelled"
    result.why[eid] = "dispatched, never started, and no recorded decision cancelled it"
    return "lost"


def _compare_report(data: RunData, result: AccountingResult) -> None:
    if data.summary is None or "executions" not in data.summary:
        return
    reported = {k: int(v) for k, v in data.summary["executions"].items()}
    mine = result.counts()
    differences = [
        f"{k}: report {reported.get(k, 0)}, records {mine.get(k, 0)}"
        for k in sorted(set(reported) | set(mine))
        if reported.get(k, 0) != mine.get(k, 0)
    ]
    result.matches_report = not differences
    if differences:
        result.defects.append("accounting and report differ: " + "; ".join(differences))
