"""The held-out evaluation pool: never dispatched, scored at fixed steps on kept publications, the same
draws for the same weights (seeded), and a step whose weights were never seen reported, not dropped."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.demo.config import demo_config
from app.demo.heldout import HeldOut, eval_steps
from gyre.config.tasks import TasksSection
from gyre.paths import REPO_ROOT
from gyre.tasks.taskset import TaskSet
from gyre.trainer.checkpoint import published_path

WARMSTART = REPO_ROOT / "harness" / "demo_model" / "checkpoints" / "warmstart"


def test_eval_steps_are_zero_every_kth_and_the_last() -> None:
    assert eval_steps(12, 4) == [0, 4, 8, 12]
    assert eval_steps(10, 4) == [0, 4, 8, 10]
    assert eval_steps(2, 4) == [0, 2]


def test_held_out_tasks_are_never_dispatched_even_when_a_suite_lists_them() -> None:
    tasks = TaskSet.from_section(TasksSection(queries=["add"], held_out=["add/2+2", "add/4+1"]))
    ids = {q.task_id for q in tasks.queries}
    assert "add/3+3" in ids and not ids & {"add/2+2", "add/4+1"}
    with pytest.raises(ValueError, match="task ids"):
        TasksSection(held_out=["add"])


def test_the_demo_pool_is_disjoint_from_what_it_trains_on() -> None:
    config = demo_config(None, {})
    dispatched = {q.task_id for q in TaskSet.from_section(config.tasks).queries}
    assert config.tasks.held_out and not dispatched & set(config.tasks.held_out)


def test_kept_publications_are_scored_with_the_same_draws(tmp_path: Path) -> None:
    config = demo_config(
        None,
        {
            "model": {"path": str(WARMSTART)},
            "tasks": {"held_out": ["add/2+2", "add/4+1"], "held_out_samples": 2, "held_out_every_steps": 1},
        },
    )
    run_dir = tmp_path / "run"
    held = HeldOut(config, steps=3, run_dir=run_dir)
    assert held.steps == [0, 1, 2, 3]
    shutil.copytree(WARMSTART, published_path(run_dir / "checkpoints", 1))
    held.keep(1)
    shutil.rmtree(published_path(run_dir / "checkpoints", 1))  # the trainer prunes old publications
    trainer_checkpoint = (
        run_dir / "checkpoints" / "step-00000002"
    )  # step 2 never published, only checkpointed
    shutil.copytree(WARMSTART, trainer_checkpoint)
    (trainer_checkpoint / "optimizer.pt").write_bytes(b"not needed")
    by_step = held.evaluate()  # step 3: neither
    assert [e["step"] for e in by_step] == [0, 1, 2, 3]
    first, second, third, missing = by_step
    assert first["mean_reward"] is not None and set(first["rewards"]) == {"add/2+2", "add/4+1"}
    assert all(len(r) == 2 for r in first["rewards"].values())
    assert (
        second["rewards"] == first["rewards"] == third["rewards"]
    )  # same weights, same seed: the same draws
    assert not (run_dir / "heldout" / "v00000002" / "optimizer.pt").exists()
    assert missing["mean_reward"] is None and "never seen" in missing["error"]


def test_a_run_naming_its_own_tasks_does_not_inherit_the_demo_pool() -> None:
    assert demo_config(None, {"tasks": {"held_out_every_steps": 2}}).tasks.held_out  # settings only: kept
    assert demo_config(None, {"tasks": {"queries": ["add"]}}).tasks.held_out == []
    own = demo_config(None, {"tasks": {"queries": ["add"], "held_out": ["add/2+2"]}})
    assert own.tasks.held_out == ["add/2+2"]
