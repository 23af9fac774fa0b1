"""The invariants a run must keep through faults, checked from its stored events (`events.jsonl`).

    check = check_events(read_event_lines(run_dir / "events.jsonl"), steps=4)
    check.completed, check.lost, check.double_trained, check.double_applied, check.versions_ok

- every dispatched execution is accounted exactly once (as in app/demo/report.py): a started execution
  has exactly one termination (`ExecutionTerminated`), and a member of a trained group has an evaluation;
  one with neither is `lost`, one terminated twice with different reasons is `double_accounted`;
- the group ledger (group → the policy versions of the completed steps whose batch packed it): a group in
  two trained batches is `double_trained`;
- no micro-step applied twice: the micro-step ids of the completed steps (the last `StepCompleted` of a
  version: a replayed step supersedes the update lost with a crashed core) are unique across steps;
- the policy version rises by one per step: the completed versions are exactly 1..steps, each from one batch,
  the batch of step s giving version s + 1.

Each violation keeps the time it happened (epoch seconds), so a run with several faults can attribute
violations to the fault window they fall in (app/demo/faults.py). Pure: no I/O beyond reading the file.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre.ids import step_of_batch

Event = dict[str, Any]
_SETTLED = ("EVALUATION_STATUS_VALID", "EVALUATION_STATUS_EXCLUDED", "EVALUATION_STATUS_PLACEHOLDER")


def read_event_lines(path: Path) -> list[Event]:
    """`events.jsonl` as written by `DemoRun` (one JSON object per event: subject, time_s, type, event)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(slots=True)
class Violation:
    """One broken invariant: which, about what, when."""

    kind: str
    """lost | double_accounted | double_trained | double_applied | version."""
    subject: str
    """The execution, group, micro-step or version it is about."""
    time_s: float


@dataclass(slots=True)
class RunCheck:
    """The invariants of one run, with the counts the fault report prints."""

    steps: int
    """Policy versions completed (distinct)."""
    target_steps: int
    dispatched: int
    violations: list[Violation] = field(default_factory=list)
    group_ledger: dict[str, list[int]] = field(default_factory=dict)
    """Group id → the policy versions whose steps trained it (one each, when nothing broke)."""
    replayed_steps: int = 0

    def count(self, kind: str) -> int:
        return sum(v.kind == kind for v in self.violations)

    @property
    def completed(self) -> bool:
        return self.steps >= self.target_steps and self.count("version") == 0

    @property
    def lost(self) -> int:
        return self.count("lost")

    @property
    def double_trained(self) -> int:
        return self.count("double_trained")

    @property
    def double_applied(self) -> int:
        return self.count("double_applied")

    def summary(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "steps": self.steps,
            "dispatched": self.dispatched,
            "lost": self.lost,
            "double_accounted": self.count("double_accounted"),
            "double_trained": self.double_trained,
            "double_applied": self.double_applied,
            "version_errors": self.count("version"),
            "replayed_steps": self.replayed_steps,
        }


def check_events(events: Iterable[Event], steps: int) -> RunCheck:
    """Check every invariant of the module docstring over a run's events; `steps` is the run's target."""
    members: dict[str, list[str]] = {}
    dispatched_at: dict[str, float] = {}
    started: dict[str, float] = {}
    terminations: dict[str, set[str]] = defaultdict(set)
    terminated_at: dict[str, float] = {}
    evaluated: set[str] = set()
    packed: dict[str, set[str]] = defaultdict(set)  # group -> batches
    step_events: dict[int, list[Event]] = defaultdict(list)  # version -> StepCompleted events
    for r in events:
        kind, e, t = r["type"].removeprefix("gyre.v1."), r["event"], float(r["time_s"])
        if kind == "GroupDispatched":
            members[e["groupId"]] = list(e.get("executionIds", []))
            dispatched_at[e["groupId"]] = t
        elif kind == "ExecutionStarted":
            started.setdefault(e["execution"]["executionId"], t)
        elif kind == "ExecutionTerminated":
            eid = e["execution"]["executionId"]
            terminations[eid].add(e.get("reason", "TERMINATION_REASON_UNSPECIFIED"))
            terminated_at.setdefault(eid, t)
        elif kind == "EvaluationDone" and e.get("status") in _SETTLED:
            evaluated.add(e["execution"]["executionId"])
        elif kind == "GroupPacked":
            packed[e["groupId"]].add(e["batchId"])
        elif kind == "StepCompleted":
            step_events[int(e.get("policyVersion", 0))].append(r)
    check = RunCheck(steps=len(step_events), target_steps=steps, dispatched=sum(map(len, members.values())))
    bad = check.violations
    # The steps: versions 1..n, one batch each (a replay repeats the batch), batch of step s -> version s + 1.
    final: dict[int, Event] = {}
    for version, evs in sorted(step_events.items()):
        batches = {x["event"]["batchId"] for x in evs}
        final[version] = evs[-1]
        check.replayed_steps += sum(bool(x["event"].get("replayed")) for x in evs)
        if len(batches) != 1 or step_of_batch(next(iter(batches))) + 1 != version:
            bad.append(Violation("version", f"v{version}: batches {sorted(batches)}", evs[-1]["time_s"]))
    if sorted(final) != list(range(1, len(final) + 1)):
        bad.append(
            Violation(
                "version",
                f"versions {sorted(final)} are not 1..{len(final)}",
                max((e["time_s"] for e in final.values()), default=0.0),
            )
        )
    trained_batches = {e["event"]["batchId"]: v for v, e in final.items()}
    # The group ledger.
    for group, batches in packed.items():
        versions = sorted(trained_batches[b] for b in batches if b in trained_batches)
        if versions:
            check.group_ledger[group] = versions
        if len(versions) > 1:
            bad.append(
                Violation("double_trained", f"{group} in versions {versions}", final[versions[1]]["time_s"])
            )
    # Micro-steps: each applied by one step.
    seen: dict[str, int] = {}
    for version, e in sorted(final.items()):
        for mid in e["event"].get("microstepIds", []):
            if mid in seen:
                bad.append(Violation("double_applied", f"{mid} in v{seen[mid]} and v{version}", e["time_s"]))
            seen.setdefault(mid, version)
    # Executions: each accounted once.
    for group, eids in members.items():
        consumed = bool(check.group_ledger.get(group))
        for eid in eids:
            reasons = terminations.get(eid, set())
            if len(reasons) > 1:
                bad.append(Violation("double_accounted", f"{eid}: {sorted(reasons)}", terminated_at[eid]))
            if (consumed and eid not in evaluated) or (eid in started and not reasons):
                bad.append(Violation("lost", eid, started.get(eid, dispatched_at[group])))
    return check
