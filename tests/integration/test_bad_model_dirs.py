"""Acceptance (bad input): `gyre up` with a model directory Gyre cannot use — an unsupported
architecture, no tokenizer, a truncated or shape-mismatched safetensors file — exits 2 with one line
naming the file and the field, and starts nothing (no process, no run directory of processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from gyre.model.files import check_model_dir
from gyre.model.weights import load_state_dict, write_model_dir
from tests.support.models import copy_dir, small_dir

GYRE = [sys.executable, "-c", "from app.cli import main; main()"]


def _unsupported_architecture(path: Path) -> tuple[str, str]:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["MixtralForCausalLM"]}))
    return "config.json", "architectures"


def _no_tokenizer(path: Path) -> tuple[str, str]:
    (path / "tokenizer.json").unlink()
    return "tokenizer.json", "tokenizer.json"


def _truncated(path: Path) -> tuple[str, str]:
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return "model.safetensors", "model."


def _shape_mismatch(path: Path) -> tuple[str, str]:
    info = check_model_dir(path)
    tensors = load_state_dict(info)
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(63, 32)
    write_model_dir(path, arch=info.arch, tensors=tensors, source=small_dir())
    return "model.safetensors", "model.layers.0.mlp.up_proj.weight"


@pytest.mark.parametrize("breaks", [_unsupported_architecture, _no_tokenizer, _truncated, _shape_mismatch])
def test_gyre_up_refuses_a_bad_model_directory(
    tmp_path: Path, breaks: Callable[[Path], tuple[str, str]]
) -> None:
    model = copy_dir(small_dir(), tmp_path / "model")
    file, field = breaks(model)
    config = tmp_path / "gyre.yaml"
    runs = tmp_path / "runs"
    config.write_text(f"run:\n  id: bad\n  dir: {runs}\nmodel:\n  path: {model}\n")
    result = subprocess.run(
        [*GYRE, "up", "--detach", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"{model}/{file}" in lines[0] and field in lines[0]
    assert not (runs / "bad" / "stack.json").exists() and not (runs / "bad" / "logs").exists()
