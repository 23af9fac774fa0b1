"""Acceptance (bad input): a cell agent whose engine cannot start here — a back end the registry lacks, an
`sglang_python` that is missing or has no SGLang, a CPU KV budget too small for the context SGLang serves,
a model SGLang cannot load (an architecture none of its model modules serves; one whose module needs a
kernel the CPU shim lacks; tied embeddings its module never ties), LoRA on SGLang's CPU path — exits 2 with one line naming the field, before it connects to anything or launches an engine. Each case
is checked by `check_engine` (what the cell agent runs first); the entry point's exit 2 once (a cell agent
process takes ~15 s to import its service here).

    .venv/bin/python -m pytest -q tests/integration/test_bad_engine_config.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gyre.config.engine import EngineSection
from gyre.engine.backends import ENGINE_BACKENDS, check_engine
from gyre.errors import ConfigError
from tests.support.models import hf_dir
from tests.support.sglang import sglang_python

REPO = Path(__file__).resolve().parents[2]


def _cell_agent(tmp_path: Path, engine: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    config = {
        "run": {"id": "badengine", "dir": str(tmp_path / "runs")},
        "model": {"path": str(hf_dir("qwen3"))},
        "cell_agent": {"engine": engine},
    }
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "services.cell_agent", "--config", str(config_file), "--instance", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _no_sglang_python(tmp_path: Path) -> tuple[dict[str, Any], str]:
    missing = tmp_path / "nowhere" / "python"
    return {"backend": "sglang", "sglang_python": str(missing)}, (
        f"cell_agent.engine.sglang_python: '{missing}' is not an interpreter on this machine"
    )


def _python_without_sglang(tmp_path: Path) -> tuple[dict[str, Any], str]:
    return {"backend": "sglang", "sglang_python": sys.executable}, (
        f"cell_agent.engine.sglang_python: '{sys.executable}' has no sglang installed"
    )


def _kv_budget_too_small(tmp_path: Path) -> tuple[dict[str, Any], str]:
    engine = {
        "backend": "sglang",
        "sglang_device": "cpu",
        "sglang_python": str(sglang_python()),
        "kv_cache_tokens": 4096,
    }
    return engine, (
        "cell_agent.engine.kv_cache_tokens: 4096 tokens (SGLang's --max-total-tokens) cannot hold one call "
        "of the context it serves (32768 tokens)"
    )


def _model_dir(tmp_path: Path, architecture: str) -> Path:
    """A copy of the tiny Qwen3 whose config.json names `architecture`."""
    model = tmp_path / architecture
    shutil.copytree(hf_dir("qwen3"), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "architectures": [architecture]}))
    return model


def _architecture_sglang_lacks(tmp_path: Path) -> tuple[dict[str, Any], str]:
    model = _model_dir(tmp_path, "NoSuchModelForCausalLM")
    engine = {**_cpu_sglang(), "sglang_model_path": str(model)}
    return engine, (
        f"cell_agent.engine.sglang_model_path: SGLang cannot load {model}: no module of sglang.srt.models "
        "serves NoSuchModelForCausalLM"
    )


def _architecture_needing_a_missing_kernel(tmp_path: Path) -> tuple[dict[str, Any], str]:
    """Qwen3.5's module imports a fused kernel (`fused_sigmoid_mul_cpu`) the CPU shim does not supply."""
    model = _model_dir(tmp_path, "Qwen3_5ForCausalLM")
    engine = {**_cpu_sglang(), "sglang_model_path": str(model)}
    return engine, (
        "cell_agent.engine.sglang_model_path: SGLang cannot load Qwen3_5ForCausalLM on cpu: "
        "sglang.srt.models.qwen3_5"
    )


def _tied_moe_sglang_does_not_tie(tmp_path: Path) -> tuple[dict[str, Any], str]:
    """SGLang's Qwen3-MoE ignores tie_word_embeddings (real Qwen3-MoE checkpoints are untied); the tiny
    one `gyre model init` makes is tied."""
    return _cpu_sglang(), (
        "model.path: tie_word_embeddings: SGLang's Qwen3MoeForCausalLM (sglang.srt.models.qwen3_moe) never "
        "ties lm_head to the embeddings"
    )


def _lora_on_sglang_cpu(tmp_path: Path) -> tuple[dict[str, Any], str]:
    return {**_cpu_sglang(), "enable_lora": True}, (
        "cell_agent.engine.enable_lora: SGLang's LoRA layers cannot start on CPU (sglang.srt.lora.layers "
        "allocates its offsets with pin_memory=True"
    )


def _cpu_sglang() -> dict[str, Any]:
    return {
        "backend": "sglang",
        "sglang_device": "cpu",
        "sglang_python": str(sglang_python()),
        "kv_cache_tokens": 32768,
    }


def _unregistered_backend(tmp_path: Path) -> tuple[dict[str, Any], str]:
    return {"backend": "vllm"}, (
        f"cell_agent.engine.backend: 'vllm' is not an engine backend; choose one of {', '.join(ENGINE_BACKENDS)}"
    )


@pytest.mark.parametrize(
    "breaks",
    [
        _unregistered_backend,
        _no_sglang_python,
        _python_without_sglang,
        _kv_budget_too_small,
        _architecture_sglang_lacks,
        _architecture_needing_a_missing_kernel,
        _tied_moe_sglang_does_not_tie,
        _lora_on_sglang_cpu,
    ],
)
def test_check_engine_names_the_field(tmp_path: Path, breaks: Any) -> None:
    engine, message = breaks(tmp_path)
    model = hf_dir("qwen3_moe") if breaks is _tied_moe_sglang_does_not_tie else hf_dir("qwen3")
    with pytest.raises(ConfigError) as e:
        check_engine(EngineSection(**engine), model)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    if breaks is _architecture_needing_a_missing_kernel:
        assert "fused_sigmoid_mul_cpu" in str(e.value) and "CPU shim" in str(e.value)


def test_the_cell_agent_exits_2_naming_the_field(tmp_path: Path) -> None:
    engine, message = _python_without_sglang(tmp_path)
    done = _cell_agent(tmp_path, engine)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {message}"), done.stderr
    assert not (tmp_path / "runs" / "badengine" / "logs").exists()


def test_a_fitting_sglang_config_passes() -> None:
    section = EngineSection(
        backend="sglang", sglang_device="cpu", sglang_python=str(sglang_python()), kv_cache_tokens=32768
    )
    check_engine(section, hf_dir("qwen3"))
