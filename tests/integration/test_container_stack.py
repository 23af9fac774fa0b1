"""`gyre up` / `gyre down` / `gyre tasks build` with the container launcher, as a user runs them: with no
engine answering, `gyre up` exits 2 with one line naming the field and the endpoint before anything
starts; with one, the run's executions get containers and `gyre down` leaves none of them; `gyre tasks
build` builds ahead of a run, names a failing step in one line (exit 1) and a missing engine (exit 2)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from gyre.paths import REPO_ROOT
from gyre.sandbox.launchers.base import LABEL_RUN
from tests.integration.test_stack import _gyre
from tests.support.containers import containers_of, engine_client
from tests.support.eventually import eventually_sync
from tests.support.models import small_dir

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("container_session")]


def _config(tmp_path: Path, run_id: str, **container: str) -> Path:
    shutil.copytree(REPO_ROOT / "examples" / "tasks" / "fix-sum", tmp_path / "tasks" / "fix-sum")
    box = {"isolation": "container", "kill_grace_s": 1.0, "container": container}
    config = {
        "run": {"id": run_id, "dir": str(tmp_path / "runs")},
        "model": {"path": str(small_dir())},
        "scheduler": {"num_cells": 1, "group_size": 2, "batch_groups": 2},
        "tasks": {"dirs": [str(tmp_path / "tasks")]},
        "runner": {"harness": "command", "command": ["sleep", "600"], "sandbox": box},
        "evaluator": {"sandbox": box},
    }
    path = tmp_path / "gyre.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_up_without_an_engine_exits_2_before_anything_starts(tmp_path: Path) -> None:
    config = _config(tmp_path, "noengine", endpoint=f"unix://{tmp_path}/no-engine.sock")
    up = _gyre("up", "--detach", "--wait", "30", config=config)
    assert up.returncode == 2, up.stderr
    assert up.stderr.strip().splitlines() == [
        f"error: runner.sandbox.isolation container: no container engine answers at "
        f"unix://{tmp_path}/no-engine.sock: no such socket"
    ]
    assert not (tmp_path / "runs" / "noengine").exists()  # nothing started, nothing written


def test_down_leaves_no_container_of_the_run(tmp_path: Path, run_id: str) -> None:
    client = engine_client()
    config = _config(tmp_path, run_id)
    up = _gyre("up", "--detach", "--wait", "60", config=config)
    assert up.returncode == 0, up.stderr
    try:
        eventually_sync(
            lambda: containers_of(client, **{LABEL_RUN: run_id}),
            timeout_s=120,
            interval_s=0.5,
            what="an execution of the run to get a container",
        )
    finally:
        down = _gyre("down", config=config)
    assert down.returncode == 0, down.stderr
    assert containers_of(client, **{LABEL_RUN: run_id}) == []


def test_tasks_build_builds_ahead_and_names_the_failing_step(tmp_path: Path) -> None:
    engine_client()
    shutil.copytree(REPO_ROOT / "examples" / "tasks" / "fix-sum", tmp_path / "tasks" / "fix-sum")
    broken = tmp_path / "tasks" / "broken"
    shutil.copytree(REPO_ROOT / "examples" / "tasks" / "fix-sum", broken)
    (broken / "environment" / "Dockerfile").write_text(
        "FROM localhost/gyre/debian-base:bookworm\nRUN exit 7\n"
    )
    config = tmp_path / "gyre.yaml"
    config.write_text(yaml.safe_dump({"run": {"id": "build", "dir": str(tmp_path / "runs")}}))
    build = _gyre("tasks", "build", str(tmp_path / "tasks"), config=config)
    assert build.returncode == 1, build.stderr
    assert re.fullmatch(
        r"tasks/fix-sum: localhost/gyre/env:[0-9a-f]{24} (cached|built in [0-9.]+ s \(log \S+\))",
        build.stdout.splitlines()[0],
    )
    (error,) = build.stderr.strip().splitlines()
    assert (
        error.startswith("error: task tasks/broken: image build failed at STEP 2/") and "RUN exit 7" in error
    )
    assert "exit status 7" in error and str(tmp_path / "runs" / "build" / "builds") in error
    config.write_text(
        yaml.safe_dump({"runner": {"sandbox": {"container": {"endpoint": f"unix://{tmp_path}/x.sock"}}}})
    )
    none = _gyre("tasks", "build", str(tmp_path / "tasks" / "fix-sum"), config=config)
    assert none.returncode == 2 and none.stderr.strip() == (
        f"error: no container engine answers at unix://{tmp_path}/x.sock: no such socket"
    )
