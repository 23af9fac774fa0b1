"""Per-step training metrics, joined from the run's events: one row per optimizer step.

    rows = StepRows()
    for event in events:                      # GroupPacked, MicroStepEnqueued, StreamClosed, StepCompleted
        for row in rows.add(event):
            sink.write(row)                   # a dict: the line of `metrics.jsonl`

The packer knows each group's rewards, admitted leaves and staleness (`GroupPacked`) and the tokens of each
micro-step (`MicroStepEnqueued`); the core knows the loss, the clip and mask fractions, the importance
ratios, the train/inference mismatch and the gradient norm of the step (`StepCompleted`). A step's row is
complete once its `StepCompleted` and its batch's `StreamClosed` have both arrived, in any order
(`StreamClosed` follows every `GroupPacked` of its batch on the bus). Duplicate deliveries change nothing; a step is emitted once (`done` holds the steps
already written, e.g. read back from `metrics.jsonl` after a restart).

`scalars(row)` flattens a row into the named numbers every sink logs (`reward_mean`,
`admitted_trajectories/main`, …): the JSONL line holds them all, plus the per-group list.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from gyre.ids import step_of_batch
from gyre.v1 import events_pb2 as ev

CONSUMED: tuple[type[Message], ...] = (
    ev.GroupPacked,
    ev.MicroStepEnqueued,
    ev.StreamClosed,
    ev.StepCompleted,
)
"""Event types a `StepRows` reads (others are ignored)."""


@dataclass(slots=True)
class _Batch:
    groups: dict[str, ev.GroupPacked] = field(default_factory=dict)
    microstep_tokens: dict[str, int] = field(default_factory=dict)
    closed: ev.StreamClosed | None = None
    completed: ev.StepCompleted | None = None


class StepRows:
    def __init__(self, done: Iterable[int] = ()) -> None:
        self.done: set[int] = set(done)
        """Steps whose row was emitted."""
        self._batches: dict[int, _Batch] = {}

    def add(self, event: Message) -> list[dict[str, Any]]:
        """Take one event; returns the rows it completes (zero or one)."""
        match event:
            case ev.GroupPacked():
                step = step_of_batch(event.batch_id)
                if step not in self.done:
                    self._batch(step).groups[event.group_id] = event
            case ev.MicroStepEnqueued():
                if event.step not in self.done:
                    self._batch(int(event.step)).microstep_tokens[event.microstep_id] = event.num_tokens
            case ev.StreamClosed():
                step = step_of_batch(event.batch_id)
                if step not in self.done:
                    self._batch(step).closed = event
            case ev.StepCompleted():
                step = int(event.policy_version) - 1
                if step not in self.done:
                    self._batch(step).completed = event
            case _:
                return []
        return self._ready()

    def _batch(self, step: int) -> _Batch:
        return self._batches.setdefault(step, _Batch())

    def _ready(self) -> list[dict[str, Any]]:
        rows = []
        for step in sorted(self._batches):
            b = self._batches[step]
            if b.closed is None or b.completed is None or len(b.groups) < b.closed.num_groups:
                continue
            rows.append(_row(step, b))
            self.done.add(step)
            del self._batches[step]
        return rows


def _pooled(groups: list[ev.GroupPacked]) -> tuple[float, float]:
    """Mean and population std of the rewards of every resolved member of the batch's groups."""
    n = sum(g.num_resolved for g in groups)
    if n == 0:
        return 0.0, 0.0
    mean = sum(g.num_resolved * g.reward_mean for g in groups) / n
    second = sum(g.num_resolved * (g.reward_std**2 + g.reward_mean**2) for g in groups) / n
    return mean, math.sqrt(max(0.0, second - mean * mean))


def _row(step: int, b: _Batch) -> dict[str, Any]:
    assert b.closed is not None and b.completed is not None
    c = b.completed
    groups = [b.groups[g] for g in sorted(b.groups)]
    reward_mean, reward_std = _pooled(groups)
    trajectories: dict[str, int] = {}
    targets: dict[str, int] = {}
    for g in groups:
        for leaf_class, n in g.admitted_by_class.items():
            trajectories[leaf_class] = trajectories.get(leaf_class, 0) + n
        for leaf_class, n in g.targets_by_class.items():
            targets[leaf_class] = targets.get(leaf_class, 0) + n
    staleness = [g.staleness for g in groups]
    trained = c.num_targets > 0  # without targets there is no ratio (the fields are 0 on the wire)
    measured = c.num_mismatch_targets > 0
    return {
        "step": step,
        "policy_version": int(c.policy_version),
        "batch_id": c.batch_id,
        "time_s": c.meta.emitted_at_ms / 1000.0,
        "num_groups": len(groups),
        "reward_mean": reward_mean,
        "reward_std": reward_std,
        "loss": c.loss,
        "clip_fraction": c.clip_fraction,
        "token_ratio_min": c.token_ratio_min if trained else None,
        "token_ratio_mean": c.token_ratio_mean if trained else None,
        "token_ratio_max": c.token_ratio_max if trained else None,
        "sequence_ratio_min": c.sequence_ratio_min if trained else None,
        "sequence_ratio_mean": c.sequence_ratio_mean if trained else None,
        "sequence_ratio_max": c.sequence_ratio_max if trained else None,
        "token_mask_fraction": c.token_mask_fraction,
        "sequence_mask_fraction": c.sequence_mask_fraction,
        # measured on the targets sampled at the trainer's own version only; None when there were none
        "num_mismatch_targets": int(c.num_mismatch_targets),
        "mismatch_kl": c.mismatch_kl if measured else None,
        "mismatch_kl_execution": c.mismatch_kl_execution if measured else None,
        "mismatch_abs_log_ratio_mean": c.mismatch_abs_log_ratio_mean if measured else None,
        "mismatch_abs_log_ratio_max": c.mismatch_abs_log_ratio_max if measured else None,
        "mismatch_over_bound_fraction": c.mismatch_over_bound_fraction if measured else None,
        "grad_norm": c.grad_norm,
        "num_tokens": sum(b.microstep_tokens.values()),
        "num_target_tokens": int(c.num_targets),
        "num_microsteps": int(c.num_microsteps),
        "admitted_trajectories": dict(sorted(trajectories.items())),
        "admitted_target_tokens": dict(sorted(targets.items())),
        "staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
        "staleness_max": max(staleness, default=0),
        "step_s": c.duration_s,
        "cells": list(c.cells),
        "groups": [
            {
                "group_id": g.group_id,
                "reward_mean": g.reward_mean,
                "reward_std": g.reward_std,
                "num_resolved": g.num_resolved,
                "staleness": int(g.staleness),
                "num_trajectories": g.num_trajectories,
                "num_target_tokens": int(g.num_targets),
            }
            for g in groups
        ],
    }


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The row's numbers by name: top-level numbers as they are (not the step, version and time, which every
    sink records as such; not a ratio of a step without targets), per-class counts as `<field>/<class>`."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in ("step", "policy_version", "time_s") or isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float):
            out[key] = float(value)
        elif isinstance(value, dict):
            out.update({f"{key}/{k}": float(v) for k, v in value.items()})
    return out
