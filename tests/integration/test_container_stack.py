"""`gyre up` / `gyre down` with the container launcher, as a user runs them: with no engine answering,
`gyre up` exits 2 with one line naming the field and the endpoint before anything starts; with one, the
run's executions get containers and `gyre down` leaves none of them."""

from __future__ import annotations

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
