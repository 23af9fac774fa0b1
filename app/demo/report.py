"""A run's report from its events: summary.json, the role timeline and reward/staleness per step.

Every dispatched execution is accounted for exactly once:
  trained      its group was consumed by a completed optimizer step and its outcome was valid
  excluded     its group was consumed and it was excluded (no valid score within its budget)
  placeholder  its group was consumed and it was a placeholder (nothing evaluable)
  cancelled    it was cancelled (at shutdown) or never started
  unconsumed   it finished, but its group was not trained before the run ended

and, separately, by how it terminated (`terminations`: completed, failed, harness_timeout, ...).

No silent runs: `refused_calls` counts the model calls the proxy answered with an error, by reason
(with the latest message of each in `refusal_messages`), `executions_without_targets` the executions of
consumed groups that contributed no target token, and `target_tokens_by_step` what each step trained;
`run_warnings` turns a run that trained (almost) nothing into lines the demo prints at the end, and
`trained_nothing` is what makes `gyre demo` exit non-zero.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.demo.events import RecordedEvent
from gyre.ids import step_of_batch
from gyre.v1 import common_pb2 as common
from gyre.v1 import events_pb2 as ev

_TRAINING, _ROLLOUT = common.CELL_ROLE_TRAINING, common.CELL_ROLE_ROLLOUT


@dataclass
class RunFacts:
    """What the report needs besides events (from the config and the proxy's counters)."""

    mode: str
    phi: float
    mu: int
    num_cells: int
    group_size: int
    cell_capacity: int
    separate_pool_capacity: int
    reroutes: int = 0
    kv_migrated_tokens: int = 0
    harness_errors_during_transitions: int = 0
    recorded_calls: int = 0
    history_mismatches: int = 0
    side_calls: int = 0
    refused_calls: dict[str, int] = field(default_factory=dict)
    """Model calls the proxy answered with an error, by reason (ProxyStats.refused_calls)."""
    refusal_messages: dict[str, str] = field(default_factory=dict)
    """The latest message per refusal reason."""
    wall_s: float = 0.0
    chat_template: dict[str, Any] = field(default_factory=dict)
    """The chat template the proxy rendered with (ProxyStats.chat_template: name, source, and for a
    registry template standing in for the model's own, its family and what it replaced)."""
    extra: dict[str, Any] = field(default_factory=dict)


def _median(xs: Sequence[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def _mean(xs: Sequence[float]) -> float | None:
    return round(statistics.fmean(xs), 4) if xs else None


def _terminations(reason: dict[str, int]) -> dict[str, int]:
    """Executions per termination class (`TERMINATION_REASON_FAILED` → `failed`), each counted once."""
    counts: dict[str, int] = defaultdict(int)
    for r in reason.values():
        counts[common.TerminationReason.Name(r).removeprefix("TERMINATION_REASON_").lower()] += 1
    return dict(sorted(counts.items()))


@dataclass
class _RunEvents:
    """What a run's events say, gathered in one pass (the report's raw material)."""

    group_members: dict[str, list[str]] = field(default_factory=dict)
    group_reward: dict[str, float] = field(default_factory=dict)
    group_step: dict[str, int] = field(default_factory=dict)
    staleness_by_step: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    group_without_targets: dict[str, int] = field(default_factory=dict)
    admitted_by_class: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    completed_steps: dict[int, ev.StepCompleted] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)
    reason: dict[str, int] = field(default_factory=dict)
    durations: dict[str, list[float]] = field(default_factory=lambda: {"training": [], "rollout": []})

    @classmethod
    def collect(cls, events: Sequence[RecordedEvent]) -> _RunEvents:
        run = cls()
        for r in events:
            run.add(r.event)
        return run

    def add(self, e: Any) -> None:
        match e:
            case ev.GroupDispatched():
                self.group_members[e.group_id] = list(e.execution_ids)
            case ev.GroupReady():
                self.group_reward[e.group_id] = e.mean_reward
            case ev.GroupPacked():
                step = step_of_batch(e.batch_id)
                self.group_step[e.group_id] = step
                self.staleness_by_step[step].append(e.staleness)
                self.group_without_targets[e.group_id] = e.num_executions_without_targets
                for leaf_class, n in e.admitted_by_class.items():
                    self.admitted_by_class[leaf_class] += n
            case ev.StepCompleted():
                self.completed_steps[e.policy_version - 1] = e
            case ev.EvaluationDone():
                self.status[e.execution.execution_id] = e.status
            case ev.ExecutionTerminated():
                self.reason[e.execution.execution_id] = e.reason
            case ev.RoleTransitionCompleted():
                key = "training" if e.to_role == _TRAINING else "rollout"
                self.durations[key].append(e.duration_s)

    def consumed_groups(self) -> list[str]:
        return [g for g in self.group_members if self.group_step.get(g) in self.completed_steps]

    def executions(self) -> dict[str, int]:
        """`dispatched`, and every dispatched execution in exactly one class: trained, excluded,
        placeholder (their group was consumed by a completed step), cancelled, or unconsumed."""
        counts = dict.fromkeys(("trained", "excluded", "placeholder", "cancelled", "unconsumed"), 0)
        for group_id, members in self.group_members.items():
            consumed = self.group_step.get(group_id) in self.completed_steps
            for eid in members:
                st = self.status.get(eid)
                if consumed and st == common.EVALUATION_STATUS_VALID:
                    counts["trained"] += 1
                elif consumed and st == common.EVALUATION_STATUS_EXCLUDED:
                    counts["excluded"] += 1
                elif consumed and st == common.EVALUATION_STATUS_PLACEHOLDER:
                    counts["placeholder"] += 1
                elif self.reason.get(eid) == common.TERMINATION_REASON_CANCELLED or eid not in self.reason:
                    counts["cancelled"] += 1
                else:
                    counts["unconsumed"] += 1
        return {"dispatched": sum(len(m) for m in self.group_members.values()), **counts}


def execution_counts(events: Sequence[RecordedEvent]) -> dict[str, int]:
    """summary.json's `executions` of a run with these events (what `gyre audit` compares its own
    accounting with)."""
    return _RunEvents.collect(events).executions()


def summarize(events: Sequence[RecordedEvent], facts: RunFacts) -> dict[str, Any]:
    run = _RunEvents.collect(events)
    steps = sorted(run.completed_steps)
    completed, staleness = run.completed_steps, run.staleness_by_step
    consumed_groups = run.consumed_groups()
    reward_by_step = [
        _mean([run.group_reward[g] for g, s in run.group_step.items() if s == step and g in run.group_reward])
        for step in steps
    ]
    third = max(1, len(reward_by_step) // 3)
    rewards = [x for x in reward_by_step if x is not None]
    return {
        "mode": facts.mode,
        "phi": facts.phi,
        "mu": facts.mu,
        "steps": len(steps),
        "reward_by_step": reward_by_step,
        "reward_first_third": _mean(rewards[:third]),
        "reward_last_third": _mean(rewards[-third:]),
        "mean_staleness": _mean([x for s in steps if s >= facts.mu for x in staleness[s]]),
        "mean_staleness_all_steps": _mean([x for s in steps for x in staleness[s]]),
        "staleness_by_step": [_mean(staleness[s]) for s in steps],
        "target_staleness": facts.phi + (facts.mu - 1) / 2,
        "executions": run.executions(),
        "executions_consumed": sum(len(run.group_members[g]) for g in consumed_groups),
        "executions_without_targets": sum(run.group_without_targets.get(g, 0) for g in consumed_groups),
        "target_tokens_by_step": [int(completed[s].num_targets) for s in steps],
        "refused_calls": dict(sorted(facts.refused_calls.items())),
        "refusal_messages": dict(sorted(facts.refusal_messages.items())),
        "terminations": _terminations(run.reason),
        "harness_errors_during_transitions": facts.harness_errors_during_transitions,
        "transitions": {
            "count": sum(len(v) for v in run.durations.values()),
            "median_s_to_training": _median(run.durations["training"]),
            "median_s_to_rollout": _median(run.durations["rollout"]),
        },
        "reroutes": facts.reroutes,
        "kv_migrated_tokens": facts.kv_migrated_tokens,
        "admitted_trajectories_by_class": dict(sorted(run.admitted_by_class.items())),
        "recorded_calls": facts.recorded_calls,
        "side_calls": facts.side_calls,
        "history_mismatch_rate": round(facts.history_mismatches / facts.recorded_calls, 4)
        if facts.recorded_calls
        else 0.0,
        "chat_template": facts.chat_template,
        "wall_s": round(facts.wall_s, 1),
        "loss_by_step": [round(completed[s].loss, 5) for s in steps],
        "clip_fraction_by_step": [round(completed[s].clip_fraction, 4) for s in steps],
        "token_mask_fraction_by_step": [round(completed[s].token_mask_fraction, 4) for s in steps],
        "sequence_mask_fraction_by_step": [round(completed[s].sequence_mask_fraction, 4) for s in steps],
        # k3 per target sampled at the trainer's own version; None for a step that measured none
        "mismatch_kl_by_step": [
            completed[s].mismatch_kl if completed[s].num_mismatch_targets else None for s in steps
        ],
        **facts.extra,
    }


def trained_nothing(summary: dict[str, Any]) -> bool:
    """No completed step trained a single target token (or no step completed)."""
    return not any(summary["target_tokens_by_step"])


def run_warnings(summary: dict[str, Any]) -> list[str]:
    """What a reader of the run must not miss: lines for the end of `gyre demo`, empty for a healthy run.

    Loud when no step trained a token or most consumed executions contributed none; refused calls are
    named with their reasons and latest messages either way."""
    lines: list[str] = []
    consumed, empty = summary["executions_consumed"], summary["executions_without_targets"]
    refused = summary["refused_calls"]
    num_refused = sum(refused.values())
    if trained_nothing(summary):
        lines.append(f"no optimizer step trained a token: {summary['steps']} step(s), 0 target tokens")
    if consumed and empty * 2 > consumed:
        lines.append(
            f"{empty} of {consumed} consumed executions ({empty / consumed:.0%}) contributed no trainable token"
        )
    if summary.get("same_container_verifier_tasks"):
        lines.append(
            "verified in the execution's own container (same_container: the harness could change the "
            f"grader): {', '.join(summary['same_container_verifier_tasks'])}"
        )
    if num_refused:
        lines.append(f"{num_refused} model calls were refused by the proxy:")
        for reason, n in sorted(refused.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {reason}: {n} (latest: {summary['refusal_messages'].get(reason, '')})")
    return lines


def timeline(events: Sequence[RecordedEvent], facts: RunFacts, title: str) -> Any:
    """The role timeline (sim's Timeline, in seconds) rebuilt from transition and micro-step events."""
    from gyre.metrics.timeline import (
        DRAINING,
        RETURNING,
        ROLLOUT,
        TRAINING_BUSY,
        TRAINING_IDLE,
        CellUsage,
        Timeline,
    )

    t0 = events[0].time_s if events else 0.0
    usage = CellUsage(facts.num_cells, record=True)
    busy = [0] * facts.num_cells
    roles = [_ROLLOUT] * facts.num_cells
    d = f = p = 0
    series: list[tuple[float, int, int, int]] = []
    step_end: list[float] = []
    publish: list[float] = []

    def capacity() -> int:
        serving = sum(1 for r in roles if r == _ROLLOUT)
        return facts.separate_pool_capacity + serving * facts.cell_capacity

    for r in events:
        now, e = r.time_s - t0, r.event
        match e:
            case ev.RoleTransitionBegun():
                roles[e.cell] = e.to_role if e.to_role == _TRAINING else common.CELL_ROLE_DRAINING
                usage.set(e.cell, DRAINING if e.to_role == _TRAINING else RETURNING, now)
            case ev.RoleTransitionCompleted():
                roles[e.cell] = e.to_role
                usage.set(e.cell, TRAINING_IDLE if e.to_role == _TRAINING else ROLLOUT, now)
            case ev.MicroStepClaimed():
                busy[e.cell] += 1
                usage.set(e.cell, TRAINING_BUSY, now)
            case ev.MicroStepDone():
                busy[e.cell] = max(0, busy[e.cell] - 1)
                if not busy[e.cell]:
                    usage.set(e.cell, TRAINING_IDLE, now)
            case ev.GroupDispatched():
                d += len(e.execution_ids)
            case ev.ExecutionStarted():
                p += 1
            case ev.ExecutionTerminated():
                f += 1
            case ev.StepCompleted():
                step_end.append(now)
            case ev.WeightsPublished():
                publish.append(now)
            case _:
                continue
        series.append((now, d - f, capacity(), p - f))
    end = (events[-1].time_s - t0) if events else 0.0
    usage.close(end)
    return Timeline(
        num_cells=facts.num_cells,
        segments=usage.segments or [],
        series=series,
        step_end_s=step_end,
        publish_s=publish,
        title=title,
        time_unit=("seconds", 1.0),
    )


def plot_reward_staleness(summary: dict[str, Any], path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5.5))
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    steps = list(range(1, summary["steps"] + 1))
    rewards = [float("nan") if x is None else x for x in summary["reward_by_step"]]
    top.plot(steps, rewards, marker="o", color="#C44E52")
    top.set_ylabel("mean group reward")
    top.set_title(f"{summary['mode']} (φ={summary['phi']}, μ={summary['mu']}): reward and staleness per step")
    stale = [float("nan") if x is None else x for x in summary["staleness_by_step"]]
    bottom.bar(steps, stale, color="#4C72B0", label="mean staleness of the batch")
    bottom.axhline(summary["target_staleness"], color="black", linestyle="--", label="target φ + (μ−1)/2")
    bottom.set_xlabel("optimizer step")
    bottom.set_ylabel("staleness (versions)")
    bottom.legend(fontsize=8, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
