"""One row per optimizer step, joined from the packer's and the core's events in any order, once."""

from __future__ import annotations

import math

import pytest

from gyre.ids import batch_id
from gyre.metrics.steps import StepRows, scalars
from gyre.v1 import events_pb2 as ev


def _events(step: int, *, targets: int = 40) -> list[object]:
    b = batch_id("r1", step)
    return [
        ev.GroupPacked(
            batch_id=b,
            group_id=f"g{step}a",
            staleness=1,
            num_trajectories=3,
            num_targets=30,
            reward_mean=0.5,
            reward_std=0.5,
            num_resolved=2,
            admitted_by_class={"main": 2, "sub_agent": 1},
            targets_by_class={"main": 20, "sub_agent": 10},
        ),
        ev.GroupPacked(
            batch_id=b,
            group_id=f"g{step}b",
            staleness=0,
            num_trajectories=2,
            num_targets=10,
            reward_mean=1.0,
            reward_std=0.0,
            num_resolved=2,
            admitted_by_class={"main": 2},
            targets_by_class={"main": 10},
        ),
        ev.MicroStepEnqueued(batch_id=b, microstep_id=f"{b}-m0", num_tokens=100, step=step),
        ev.MicroStepEnqueued(batch_id=b, microstep_id=f"{b}-m1", num_tokens=50, step=step),
        ev.StreamClosed(batch_id=b, num_microsteps=2, num_groups=2, mean_reward=0.75),
        ev.StepCompleted(
            meta=ev.EventMeta(emitted_at_ms=1_000_000),
            batch_id=b,
            policy_version=step + 1,
            cells=[0, 1],
            num_microsteps=2,
            loss=0.25,
            grad_norm=1.5,
            duration_s=3.0,
            num_targets=targets,
            clip_fraction=0.1,
            token_ratio_min=0.9,
            token_ratio_mean=1.0,
            token_ratio_max=1.2,
            sequence_ratio_min=0.95,
            sequence_ratio_mean=1.0,
            sequence_ratio_max=1.05,
        ),
    ]


def test_a_step_row_has_every_field_once_both_sides_arrived() -> None:
    rows = StepRows()
    events = _events(3)
    completed, packer_side = events[-1], events[:-1]
    assert rows.add(completed) == []  # the core's event first: the batch is not closed yet
    out = [row for e in [*packer_side, completed] for row in rows.add(e)]  # type: ignore[arg-type]
    (row,) = out
    assert row["step"] == 3 and row["policy_version"] == 4 and row["num_groups"] == 2
    assert row["reward_mean"] == pytest.approx(0.75)
    # pooled over the 4 resolved members {0, 1, 1, 1}: std = sqrt(0.75 * 0.25)
    assert row["reward_std"] == pytest.approx(math.sqrt(0.1875))
    assert (row["loss"], row["clip_fraction"], row["grad_norm"], row["step_s"]) == (0.25, 0.1, 1.5, 3.0)
    assert (row["token_ratio_min"], row["token_ratio_mean"], row["token_ratio_max"]) == (0.9, 1.0, 1.2)
    assert (row["sequence_ratio_min"], row["sequence_ratio_max"]) == (0.95, 1.05)
    assert row["num_tokens"] == 150 and row["num_target_tokens"] == 40
    assert row["admitted_trajectories"] == {"main": 4, "sub_agent": 1}
    assert row["admitted_target_tokens"] == {"main": 30, "sub_agent": 10}
    assert row["staleness_mean"] == 0.5 and row["staleness_max"] == 1
    assert [g["group_id"] for g in row["groups"]] == ["g3a", "g3b"] and row["groups"][0]["reward_std"] == 0.5
    for e in events:  # redeliveries change nothing
        assert rows.add(e) == []
    flat = scalars(row)
    assert flat["admitted_trajectories/main"] == 4.0 and flat["loss"] == 0.25
    assert "step" not in flat and "time_s" not in flat and "groups" not in flat


def test_rows_wait_for_every_group_and_skip_written_steps() -> None:
    rows = StepRows(done={0})
    assert [r for e in _events(0) for r in rows.add(e)] == []  # already in metrics.jsonl
    events = _events(1)
    late_group = events[1]
    out = [r for e in events if e is not late_group for r in rows.add(e)]
    assert out == []  # StreamClosed says 2 groups, one has not arrived
    (row,) = rows.add(late_group)
    assert row["step"] == 1 and rows.done == {0, 1}


def test_a_step_without_targets_has_no_ratios() -> None:
    rows = StepRows()
    (row,) = [r for e in _events(0, targets=0) for r in rows.add(e)]
    assert row["token_ratio_min"] is None and row["sequence_ratio_mean"] is None
    assert "token_ratio_min" not in scalars(row)


def test_mask_fractions_and_the_mismatch_reach_the_row_only_when_measured() -> None:
    events = _events(2)
    completed = events[-1]
    assert isinstance(completed, ev.StepCompleted)
    completed.token_mask_fraction, completed.sequence_mask_fraction = 0.05, 0.25
    rows = StepRows()
    (row,) = [r for e in events for r in rows.add(e)]
    assert (row["token_mask_fraction"], row["sequence_mask_fraction"]) == (0.05, 0.25)
    # no target sampled at the trainer's version (every group stale): no mismatch, not a zero one
    assert row["num_mismatch_targets"] == 0 and row["mismatch_kl"] is None
    assert "mismatch_kl" not in scalars(row)
    completed.num_mismatch_targets, completed.mismatch_kl, completed.mismatch_abs_log_ratio_max = (
        30,
        0.002,
        0.4,
    )
    rows = StepRows()
    (row,) = [r for e in events for r in rows.add(e)]
    assert (row["mismatch_kl"], row["mismatch_abs_log_ratio_max"]) == (0.002, 0.4)
    assert scalars(row)["mismatch_kl"] == 0.002
