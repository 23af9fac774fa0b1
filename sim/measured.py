"""What one measured run of the real stack recorded, read back for calibrating the simulator.

A `gyre bench e2e` mode is a `gyre demo` run; its directory keeps every event (`events.jsonl`) and,
per execution, the sandbox's records (`sandboxes/<execution>/control/`: the demo harness's report line
in `stdout.log` with its model calls, tool calls and slept seconds). `read_run(run_dir)` turns them
into per-execution and per-cell figures:

    run = read_run(Path("runs/bench-e2e-async-…"))
    run.executions[0].busy_s        # the execution's duration minus its tool sleeps
    run.microstep_tokens_per_s      # training throughput of one cell, from MicroStepDone
    run.scheduled_s(steps=6)        # first dispatch → 6th step (what the simulator predicts)

Only what the stack measured is read; nothing is fitted here (sim/local.py builds the cell model).
`trim_run(run_dir, out_dir)` copies just what `read_run` reads (a few hundred KB instead of the run's
NATS and Redis data, checkpoints and workspaces), to keep a measured run or make a test fixture: the
events it reads, the settings, and the harnesses' report lines gathered in one file
(`harness_reports.jsonl`, one `{"execution_id", "report"}` per line), which `read_run` reads instead of
the sandboxes when it is there.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True, slots=True)
class MeasuredExecution:
    """One execution that ran to its end (cancelled ones are left out)."""

    execution_id: str
    group_id: str
    suite: str
    """The task's suite (`add`, `parts`: the part of the query id before `/`)."""
    duration_s: float
    """The runner's start (claim) → termination, as ExecutionTerminated reports it."""
    tool_sleep_s: float
    """Seconds the harness slept in tool latency (its report line)."""
    model_calls: int
    tool_calls: int
    evaluation_s: float
    """ExecutionTerminated → EvaluationDone."""

    @property
    def busy_s(self) -> float:
        """Everything but the tool sleeps: sandbox start, model calls through proxy and engine, tools."""
        return max(0.0, self.duration_s - self.tool_sleep_s)


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    run_dir: str
    mode: str
    executions: tuple[MeasuredExecution, ...]
    query_order: tuple[str, ...]
    """Query id of each dispatched group, in dispatch order."""
    microstep_tokens: tuple[int, ...]
    microstep_s: tuple[float, ...]
    """Forward + backward of each micro-step inside its cell (MicroStepDone)."""
    tokens_per_execution: float
    """Trained tokens per packed execution (MicroStepEnqueued tokens / executions)."""
    step_overhead_s: tuple[float, ...]
    """Last micro-step done → step completed: reduction, clipping, optimizer."""
    to_training_s: tuple[float, ...]
    to_rollout_s: tuple[float, ...]
    publish_s: tuple[float, ...]
    step_end_s: tuple[float, ...]
    """Completed steps, seconds after the first dispatch."""
    claim_s: tuple[float, ...] = ()
    """When the runner took each execution that ran (termination − duration), after the first dispatch."""
    failed: int = 0
    """Executions that ended FAILED or INFRA_FAILURE (a harness killed from outside shows up here: another
    runner on the machine that takes the same sandbox uids kills their processes)."""

    @property
    def microstep_tokens_per_s(self) -> float:
        return sum(self.microstep_tokens) / sum(self.microstep_s) if self.microstep_s else 0.0

    def start_interval_s(self, backlog: int) -> float:
        """Seconds per start while the runner had a backlog: the first `backlog` starts of the run (the
        initial dispatch queues more than the cells hold) over the time they took."""
        n = min(backlog, len(self.claim_s))
        return (self.claim_s[n - 1] - self.claim_s[0]) / (n - 1) if n > 1 else 0.0

    def scheduled_s(self, steps: int) -> float | None:
        """First dispatch → the `steps`-th completed step (None if the run has fewer)."""
        return self.step_end_s[steps - 1] if len(self.step_end_s) >= steps else None


def _report(control: Path) -> dict[str, Any] | None:
    """The harness's JSON report line (its last stdout line), if it wrote one."""
    try:
        lines = [ln for ln in (control / "stdout.log").read_text().splitlines() if ln.strip()]
        report = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and "calls" in report else None


REPORTS_FILE = "harness_reports.jsonl"


def _reports(run_dir: Path) -> dict[str, dict[str, Any]] | None:
    """The harnesses' report lines kept by `trim_run` (None: read them from the sandboxes)."""
    path = run_dir / REPORTS_FILE
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {str(r["execution_id"]): dict(r["report"]) for r in rows}


def read_run(run_dir: Path) -> MeasuredRun:
    """The figures of one `gyre demo` run directory (ValueError naming what is missing)."""
    events_path = run_dir / "events.jsonl"
    if not events_path.exists():
        raise ValueError(f"{run_dir}: no events.jsonl (not a finished gyre demo / bench e2e run)")
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    mode = (
        json.loads((run_dir / "summary.json").read_text())["mode"]
        if (run_dir / "summary.json").exists()
        else ""
    )
    dispatched = [e for e in events if e["type"] == "gyre.v1.GroupDispatched"]
    if not dispatched:
        raise ValueError(f"{run_dir}: the run dispatched nothing")
    t0 = dispatched[0]["time_s"]
    group_of: dict[str, str] = {}
    query_of: dict[str, str] = {}
    for e in dispatched:
        query_of[e["event"]["groupId"]] = e["event"].get("queryId", "")
        for eid in e["event"].get("executionIds", []):
            group_of[eid] = e["event"]["groupId"]
    terminated: dict[str, dict[str, Any]] = {}
    evaluated: dict[str, float] = {}
    tokens = executions_packed = 0
    micro_tokens: list[int] = []
    micro_s: list[float] = []
    last_done: dict[str, float] = {}
    overhead: list[float] = []
    to_training: list[float] = []
    to_rollout: list[float] = []
    publish: list[float] = []
    steps: list[float] = []
    for e in events:
        body, kind = e["event"], e["type"].removeprefix("gyre.v1.")
        if kind == "ExecutionTerminated":
            terminated[body["execution"]["executionId"]] = {**body, "time_s": e["time_s"]}
        elif kind == "EvaluationDone":
            evaluated[body["execution"]["executionId"]] = e["time_s"]
        elif kind == "MicroStepEnqueued":
            tokens += int(body.get("numTokens", 0))
            executions_packed += int(body.get("numExecutions", 0))
        elif kind == "MicroStepDone":
            micro_tokens.append(int(body.get("numTokens", 0)))
            micro_s.append(float(body.get("durationS", 0.0)))
            last_done[body["batchId"]] = e["time_s"]
        elif kind == "StepCompleted":
            steps.append(e["time_s"] - t0)
            if body["batchId"] in last_done:
                overhead.append(e["time_s"] - last_done[body["batchId"]])
        elif kind == "RoleTransitionCompleted":
            target = to_training if body.get("toRole") == "CELL_ROLE_TRAINING" else to_rollout
            target.append(float(body.get("durationS", 0.0)))
        elif kind == "WeightsPublished":
            publish.append(float(body.get("durationS", 0.0)))
    records: list[MeasuredExecution] = []
    kept = _reports(run_dir)
    for eid, body in terminated.items():
        report = kept.get(eid) if kept is not None else _report(run_dir / "sandboxes" / eid / "control")
        if body.get("reason") == "TERMINATION_REASON_CANCELLED" or report is None or eid not in evaluated:
            continue
        group = group_of.get(eid, "")
        records.append(
            MeasuredExecution(
                execution_id=eid,
                group_id=group,
                suite=query_of.get(group, "").split("/")[0],
                duration_s=float(body.get("durationS", 0.0)),
                tool_sleep_s=float(report.get("tool_sleep_s", 0.0)),
                model_calls=int(report.get("calls", 0)),
                tool_calls=int(report.get("tool_calls", 0)),
                evaluation_s=max(0.0, evaluated[eid] - body["time_s"]),
            )
        )
    if not records:
        raise ValueError(f"{run_dir}: no execution with a harness report (the demo harness writes one)")
    return MeasuredRun(
        run_dir=str(run_dir),
        mode=mode,
        executions=tuple(records),
        query_order=tuple(query_of[e["event"]["groupId"]] for e in dispatched),
        microstep_tokens=tuple(micro_tokens),
        microstep_s=tuple(micro_s),
        tokens_per_execution=tokens / executions_packed if executions_packed else 0.0,
        step_overhead_s=tuple(overhead),
        to_training_s=tuple(to_training),
        to_rollout_s=tuple(to_rollout),
        publish_s=tuple(publish),
        step_end_s=tuple(sorted(steps)),
        claim_s=tuple(
            sorted(
                b["time_s"] - t0 - float(b.get("durationS", 0.0))
                for b in terminated.values()
                if b.get("reason") != "TERMINATION_REASON_CANCELLED"
            )
        ),
        failed=sum(
            b.get("reason") in ("TERMINATION_REASON_FAILED", "TERMINATION_REASON_INFRA_FAILURE")
            for b in terminated.values()
        ),
    )


_READ_EVENTS = {
    "GroupDispatched",
    "ExecutionTerminated",
    "EvaluationDone",
    "MicroStepEnqueued",
    "MicroStepDone",
    "StepCompleted",
    "RoleTransitionCompleted",
    "WeightsPublished",
}


def trim_run(run_dir: Path, out_dir: Path) -> None:
    """Copy of `run_dir` with only what `read_run` and the validation read (events, settings, reports)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    kept = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["type"].removeprefix("gyre.v1.") in _READ_EVENTS:
            event["event"].pop("meta", None)
            kept.append(json.dumps({k: event[k] for k in ("type", "time_s", "event")}))
    (out_dir / "events.jsonl").write_text("\n".join(kept) + "\n")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    (out_dir / "config.yaml").write_text(
        yaml.safe_dump({k: config[k] for k in ("scheduler", "packer", "tasks")})
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    (out_dir / "summary.json").write_text(json.dumps({"mode": summary["mode"]}) + "\n")
    reports = _reports(run_dir)
    if reports is None:
        found = ((c.parent.name, _report(c)) for c in sorted((run_dir / "sandboxes").glob("*/control")))
        reports = {eid: r for eid, r in found if r is not None}
    (out_dir / REPORTS_FILE).write_text(
        "".join(json.dumps({"execution_id": e, "report": r}) + "\n" for e, r in sorted(reports.items()))
    )


def median_or(values: tuple[float, ...] | list[float], default: float) -> float:
    return statistics.median(values) if values else default
