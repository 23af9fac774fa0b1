"""Routing replay (R3) on a tiny Qwen3-MoE, as `gyre bench r3` runs it: the embedded engine samples in
bfloat16 with `return_routed_experts`, calls are recorded into trajectory trees, packed as tree rows and
trained by the float32 torch trainer for 2 steps, with replay and without. With replay the trainer
routes 100% of the tokens as the engine did and the mismatch KL is lower than without, where bfloat16
flips some of the router's choices (docs/measured/r3-2026-12-07)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_routing_replay_agrees_on_every_token_and_lowers_the_mismatch(tmp_path: Path) -> None:
    args = ["bench", "r3", "--json", "--steps", "2", "--executions", "4", "--calls", "3"]
    result = subprocess.run(
        [sys.executable, "-c", "from app.cli import main; main()", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    replay, free = report["replay"], report["free"]
    assert len(replay["steps"]) == len(free["steps"]) == 2
    for step in replay["steps"]:
        assert step["routed_tokens_compared"] > 500 and step["num_target_tokens"] > 0
        assert step["routing_agreement_tokens"] == 1.0 and step["routing_agreement_layer_tokens"] == 1.0
        assert step["mismatch_target_fraction"] == 1.0  # every target was sampled at the trained version
    assert min(s["routing_agreement_tokens"] for s in free["steps"]) < 1.0, "bfloat16 flips no routing?"
    assert replay["mismatch_kl_token_mean_mean"] < free["mismatch_kl_token_mean_mean"]
    # the first step samples the same tokens in both modes (same weights, seeds): a like-for-like pair
    assert replay["steps"][0]["num_target_tokens"] == free["steps"][0]["num_target_tokens"]
    assert replay["steps"][0]["mismatch_kl_token_mean"] < free["steps"][0]["mismatch_kl_token_mean"]
