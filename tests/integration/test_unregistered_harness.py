"""`runner.harness` names an entry of the harness registry (services/runner/harnesses.py), checked before anything
starts: `gyre up` refuses a name the registry lacks before it spawns anything, and the runner's entry point exits
2 with the one line that lists the registry's names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.stack.launcher import up
from gyre.config import ConfigError
from services.runner.harnesses import HARNESSES
from tests.support.models import small_dir
from tests.support.runner_env import run_config

REPO = Path(__file__).resolve().parents[2]
MESSAGE = f"runner.harness: 'aider' is not a registered harness; available: {', '.join(HARNESSES)}"


def test_gyre_up_refuses_an_unregistered_harness_before_spawning_anything(tmp_path: Path) -> None:
    config = run_config(
        "badharness", tmp_path / "runs", "", "", runner={"harness": "aider"}, model={"path": str(small_dir())}
    )
    with pytest.raises(ConfigError) as e:
        up(config)
    assert str(e.value) == MESSAGE
    assert not (tmp_path / "runs" / "badharness").exists()  # no brokers, no logs, no processes


def test_the_runner_entry_point_exits_2_naming_the_registry(tmp_path: Path) -> None:
    config = run_config("badharness", tmp_path / "runs", "", "", runner={"harness": "aider"})
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    done = subprocess.run(
        [sys.executable, "-m", "services.runner", "--config", str(config_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: {MESSAGE}"
