"""`gyre bench weights --lora` runs to its JSON line at a tiny size: a publication and a pull of the adapter
against the full weights of the same model, in one run (the figures are measured, not asserted, but
the bytes are what they must be: the pull is the adapter's flat buffer, the publication its directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.model.lora import LoraAdapter
from gyre.model.lora_spec import LoraSpec
from gyre.model.weights import load_model
from tests.support.models import hf_dir


@pytest.mark.slow
def test_bench_weights_lora_prints_adapter_and_full_figures(tmp_path: Path) -> None:
    model = hf_dir("qwen3")
    args = [
        "--lora",
        "--model",
        str(model),
        "--rank",
        "4",
        "--target-modules",
        "q_proj",
        "v_proj",
        "--repeats",
        "1",
    ]
    result = subprocess.run(
        [sys.executable, "-c", "from app.cli import main; main()", "bench", "weights", "--json", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    arch = load_model(model).arch
    adapter = LoraAdapter(arch, LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj")))
    assert report["adapter_pull_bytes"] == adapter.num_bytes()
    assert report["full_pull_bytes"] == arch.num_parameters() * 4
    assert report["adapter_publication_bytes"] < report["full_publication_bytes"] / 10
    for kind in ("adapter", "full"):
        assert report[f"{kind}_publication_s"] > 0 and report[f"{kind}_pull_s"] > 0
