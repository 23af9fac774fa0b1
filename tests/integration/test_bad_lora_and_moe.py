"""Acceptance (bad input): LoRA settings or a mixture-of-experts config Gyre cannot run stop `gyre up`
with exit 2 and one line naming the config field or the file and field, before anything starts —
target modules that match no module of the model, a rank under 1, an MoE config field Gyre does not
compute, LoRA or MoE on the megatron backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.models import copy_dir, hf_dir

GYRE = [sys.executable, "-c", "from app.cli import main; main()"]

CASES: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        "qwen3",
        {},
        {"lora": {"target_modules": ["q_proj", "qproj"]}},
        "cell_agent.trainer.lora.target_modules: 'qproj' matches no module of Qwen3ForCausalLM",
    ),
    ("qwen3", {}, {"lora": {"rank": 0}}, "cell_agent.trainer.lora.rank: must be at least 1; got 0"),
    ("qwen3_moe", {"output_router_logits": True}, {}, "config.json: output_router_logits: the router's"),
    ("qwen3", {}, {"backend": "megatron", "lora": {"rank": 4}}, "the megatron backend does not train LoRA"),
    (
        "qwen3_moe",
        {},
        {"backend": "megatron"},
        "config.json: architectures: Qwen3MoeForCausalLM is not supported",
    ),
]


@pytest.mark.parametrize(("arch", "model_config", "trainer", "message"), CASES)
def test_gyre_up_refuses_lora_and_moe_it_cannot_run(
    tmp_path: Path, arch: str, model_config: dict[str, Any], trainer: dict[str, Any], message: str
) -> None:
    model = copy_dir(hf_dir(arch), tmp_path / "model")
    if model_config:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, **model_config}))
    runs = tmp_path / "runs"
    gyre_yaml = tmp_path / "gyre.yaml"
    gyre_yaml.write_text(
        yaml.safe_dump(
            {
                "run": {"id": "bad", "dir": str(runs)},
                "model": {"path": str(model)},
                "cell_agent": {"trainer": trainer},
            }
        )
    )
    result = subprocess.run(
        [*GYRE, "up", "--detach", "--config", str(gyre_yaml)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not (runs / "bad" / "stack.json").exists() and not (runs / "bad" / "logs").exists()
