"""The group ledger from the archive: which step trained each group, and under which policy version it was
dispatched, from the packer's batch files and the scheduler's dispatch records (not from `StepCompleted`).

    result = build_ledger(data)

Defects, each named: a batch whose steps are not 0..n−1 or whose version is not step + 1; a group listed by
two batches (trained twice); a group file that names another batch than the one listing it; a group trained
before it was dispatched (negative staleness); a micro-step that trains an execution of a group its batch
does not list, or an execution trained by two micro-steps. Then the ledger is compared with the run's own
report (`summary.json`'s staleness per step, `events.jsonl`'s GroupPacked of the completed steps): a
difference is a defect too — the report said something the primary data does not.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from app.audit.data import RunData
from gyre.ids import step_of_batch
from gyre.rl.codec import decode_microstep


@dataclass(slots=True)
class LedgerResult:
    group_step: dict[str, int] = field(default_factory=dict)
    """Group → the step that trained it."""
    staleness_by_step: list[float | None] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)
    matches_report: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "groups_trained": len(self.group_step),
            "steps": len(self.staleness_by_step),
            "staleness_by_step": self.staleness_by_step,
            "matches_report": self.matches_report,
        }


def build_ledger(data: RunData) -> LedgerResult:
    result = LedgerResult()
    bad = result.defects
    listed: dict[str, list[int]] = {}
    steps = [int(b["step"]) for b in data.batches]
    if steps != list(range(len(steps))):
        bad.append(f"the trained batches' steps are {steps}, not 0..{len(steps) - 1}")
    for b in data.batches:
        step = int(b["step"])
        if int(b["trained_version"]) != step + 1 or step_of_batch(str(b["batch_id"])) != step:
            bad.append(f"batch {b['batch_id']} of step {step} says it made version {b['trained_version']}")
        for gid in b["groups"]:
            listed.setdefault(str(gid), []).append(step)
    staleness: dict[int, list[int]] = {}
    for gid, trained in sorted(listed.items()):
        if len(trained) > 1:
            bad.append(f"group {gid} trained twice: listed by the batches of steps {sorted(trained)}")
        step = trained[0]
        result.group_step[gid] = step
        g = data.groups.get(gid)
        if g is None:
            bad.append(f"group {gid} of step {step} has no dispatch record")
            continue
        if g.archived_batch is not None and step_of_batch(g.archived_batch) != step:
            bad.append(
                f"group {gid}: its file says batch {g.archived_batch}, the batch of step {step} lists it"
            )
        if g.policy_version > step:
            bad.append(f"group {gid} trained at step {step}, before its dispatch version {g.policy_version}")
        staleness.setdefault(step, []).append(step - g.policy_version)
    for g in data.groups.values():
        if g.archived_batch is not None and g.group_id not in listed:
            bad.append(f"group {g.group_id}: its file says batch {g.archived_batch}, which does not list it")
    result.staleness_by_step = [
        round(statistics.fmean(staleness[s]), 4) if staleness.get(s) else None for s in range(len(steps))
    ]
    _microsteps(data, result)
    _compare_report(data, result)
    return result


def _microsteps(data: RunData, result: LedgerResult) -> None:
    """Every recorded micro-step trains executions of its own batch's groups, each execution once."""
    group_of = {e: g.group_id for g in data.groups.values() for e in g.execution_ids}
    trained_by: dict[str, str] = {}
    for record in data.steps:
        for mid in sorted(set(record.payloads)):
            ms = decode_microstep(record.payloads[mid])
            for eid in dict.fromkeys(ms.execution_ids):
                gid = group_of.get(eid)
                if gid is None or result.group_step.get(gid) != record.step:
                    result.defects.append(
                        f"step {record.step}: micro-step {mid} trains {eid} of group {gid}, which the batch "
                        f"of step {record.step} does not list"
                        + (
                            f" (it is trained at step {result.group_step[gid]})"
                            if gid in result.group_step
                            else ""
                        )
                    )
                if eid in trained_by and trained_by[eid] != mid:
                    result.defects.append(
                        f"execution {eid} trained twice: micro-steps {trained_by[eid]} and {mid}"
                    )
                trained_by.setdefault(eid, mid)


def _compare_report(data: RunData, result: LedgerResult) -> None:
    differences: list[str] = []
    if data.summary is not None:
        reported = data.summary.get("staleness_by_step")
        if reported is not None and [_r(x) for x in reported] != [_r(x) for x in result.staleness_by_step]:
            differences.append(
                f"staleness by step: the report says {reported}, the archive gives {result.staleness_by_step}"
            )
    if data.events is not None:
        completed = {
            int(r["event"].get("policyVersion", 0)) - 1
            for r in data.events
            if r["type"].endswith(".StepCompleted")
        }
        packed: dict[str, int] = {}
        for r in data.events:
            if r["type"].endswith(".GroupPacked"):
                step = step_of_batch(r["event"]["batchId"])
                if step in completed:
                    packed[r["event"]["groupId"]] = step
        if packed != result.group_step:
            diff = sorted(set(packed.items()) ^ set(result.group_step.items()))[:6]
            differences.append(f"group → step: the events and the archive differ in {diff}")
    if data.summary is None and data.events is None:
        return
    result.matches_report = not differences
    result.defects.extend(f"ledger and report differ: {d}" for d in differences)


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)
