"""Acceptance (bad input): a parallel layout megatron cannot build stops `gyre up` and a cell agent's
start with exit 2 and one line naming the field, before any process or process group starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.models import hf_dir

GYRE = [sys.executable, "-c", "from app.cli import main; main()"]
ENV = {**os.environ, "PYTHONPATH": os.getcwd()}


def _config(tmp_path: Path, tp: int) -> tuple[Path, Path]:
    runs = tmp_path / "runs"
    config = tmp_path / "gyre.yaml"
    config.write_text(
        f"run:\n  id: bad\n  dir: {runs}\nmodel:\n  path: {hf_dir('qwen3')}\n"
        f"cell_agent:\n  trainer:\n    backend: megatron\n    megatron:\n      tensor_parallel_size: {tp}\n"
    )
    return config, runs


@pytest.mark.parametrize(
    ("tp", "field"),
    [
        (
            4,
            "config.json: num_key_value_heads: 2 is not divisible by cell_agent.trainer.megatron.tensor_parallel_size 4",
        ),
        (2, "cell_agent.trainer.megatron.tensor_parallel_size: 2: a cell agent runs one trainer process"),
    ],
)
def test_gyre_up_and_the_cell_agent_refuse_a_layout_megatron_cannot_build(
    tmp_path: Path, tp: int, field: str
) -> None:
    config, runs = _config(tmp_path, tp)
    for argv in (
        [*GYRE, "up", "--detach", "--config", str(config)],
        [sys.executable, "-m", "services.cell_agent", "--config", str(config), "--instance", "0"],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], result.stderr
    assert not (runs / "bad" / "stack.json").exists() and not (runs / "bad" / "logs").exists()
