"""A malformed task.toml stops the run's start, naming the file and the key: each service that reads
the `tasks:` section refuses to start (its entry point exits 2 with one line), and `gyre up` refuses
before it spawns anything. Real NATS and Redis."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.stack.launcher import StackError, up
from app.stack.servers import ServerProcess, free_port
from gyre.config import GyreConfig
from gyre.tasks import TaskError
from services.evaluator.service import EvaluatorService
from services.runner.service import RunnerService
from services.scheduler.service import SchedulerService
from tests.support.models import small_dir
from tests.support.runner_env import run_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tasks" / "fix-add"


def malformed(tmp_path: Path) -> tuple[Path, str]:
    """A Harbor set whose task.toml has `[agent] timeout_sec = "fast"`; (the file, the expected message)."""
    shutil.copytree(EXAMPLE, tmp_path / "harbor" / "fix-add")
    toml = tmp_path / "harbor" / "fix-add" / "task.toml"
    toml.write_text(toml.read_text().replace("[agent]\ntimeout_sec = 300.0", '[agent]\ntimeout_sec = "fast"'))
    return toml, f"{toml.resolve()}: [agent] timeout_sec: must be a positive number of seconds; got 'fast'"


def config_for(run_id: str, tmp_path: Path, nats: ServerProcess, redis: ServerProcess) -> GyreConfig:
    return run_config(
        run_id,
        tmp_path / "runs",
        nats.url,
        redis.url,
        free_port(),
        tasks={"dirs": [str(tmp_path / "harbor")]},
        scheduler={"num_cells": 1},
        cell_agent={"ports": [free_port()], "engine_ports": [free_port()]},
    )


@pytest.mark.parametrize("service", [SchedulerService, RunnerService, EvaluatorService])
async def test_each_service_refuses_to_start_naming_file_and_key(
    service: type[SchedulerService | RunnerService | EvaluatorService],
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
) -> None:
    _, message = malformed(tmp_path)
    instance = service(config_for(run_id, tmp_path, nats_server, redis_server))
    with pytest.raises(TaskError) as e:
        await instance.start()
    await instance.stop()
    assert message in str(e.value)
    assert not (tmp_path / "runs" / run_id / "services").exists()  # it never served


def test_the_service_entry_point_exits_2_with_one_line(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
) -> None:
    _, message = malformed(tmp_path)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        yaml.safe_dump(config_for(run_id, tmp_path, nats_server, redis_server).model_dump(mode="json"))
    )
    done = subprocess.run(
        [sys.executable, "-m", "services.runner", "--config", str(config_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"error: {message}"


def test_gyre_up_refuses_before_spawning_anything(tmp_path: Path) -> None:
    _, message = malformed(tmp_path)
    config = run_config(
        "badtasks",
        tmp_path / "runs",
        "",
        "",
        tasks={"dirs": [str(tmp_path / "harbor")]},
        model={"path": str(small_dir())},
    )
    with pytest.raises(StackError) as e:
        up(config)
    assert str(e.value) == f"tasks: {message}"
    assert not (tmp_path / "runs" / "badtasks").exists()  # no brokers, no logs, no processes
