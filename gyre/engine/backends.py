"""The rollout engine back ends by name (the config field `cell_agent.engine.backend`), and the check that a
configured one can start here.

    check_engine(config.cell_agent.engine, config.model.require_path())   # ConfigError → exit 2

The engine hosts that run each back end live in the cell agent (`services.cell_agent.engine_hosts`,
keyed by these names); the library cannot import a service, so the names are registered here and the
engine contract test (tests/integration/test_engine_backends.py) keeps the two registries equal and runs
every name. To add a back end: add its name and a line on what it is here, its host there (see
`services/cell_agent/engine_hosts/base.py`), and what it needs to start to `check_engine`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from gyre.config.engine import EngineSection
from gyre.errors import ConfigError
from gyre.model.arch import read_arch

ENGINE_BACKENDS: dict[str, str] = {
    "embedded": "Gyre's engine inside the cell agent's process (torch; SGLang's native HTTP API)",
    "sglang": "an SGLang server the cell agent launches and supervises (`python -m sglang.launch_server`)",
}
"""name → what it is."""

_FIND_SGLANG = (
    "import importlib.util, sys; spec = importlib.util.find_spec('sglang'); "
    "sys.exit(3) if spec is None else print(spec.submodule_search_locations[0])"
)
_ENTRY_CLASS = re.compile(r"^EntryClass\s*=\s*(\[[^\]]*\]|\w+)", re.MULTILINE)


def check_engine(section: EngineSection, model_dir: Path) -> None:
    """`ConfigError` (one line naming the field) when `section.backend` is not registered or cannot start
    here: for `sglang`, an interpreter without sglang, a model SGLang cannot load (an architecture no
    module of `sglang.srt.models` serves, or whose module fails to import here — on CPU, a kernel the
    CPU shim does not supply), or (on CPU) a KV budget smaller than the context it serves. SGLang itself
    starts with such a budget and refuses every call longer than the budget with a 400, while it reports
    the full context length that callers size their calls by; with such a model it starts, logs the
    import error among dozens it ignores, and exits."""
    if section.backend not in ENGINE_BACKENDS:
        raise ConfigError(
            f"cell_agent.engine.backend: {section.backend!r} is not an engine backend; "
            f"choose one of {', '.join(ENGINE_BACKENDS)}"
        )
    if section.backend != "sglang":
        return
    package = _check_sglang_python(section.sglang_python)
    _check_sglang_serves(section, model_dir, package)
    if section.sglang_device == "cpu" and section.enable_lora:
        raise ConfigError(
            "cell_agent.engine.enable_lora: SGLang's LoRA layers cannot start on CPU "
            "(sglang.srt.lora.layers allocates its offsets with pin_memory=True, which needs a CUDA "
            "allocator); serve LoRA on CPU with backend: embedded"
        )
    if section.sglang_device == "cpu":
        context = served_context(section, model_dir)
        if context is not None and section.kv_cache_tokens < context:
            raise ConfigError(
                f"cell_agent.engine.kv_cache_tokens: {section.kv_cache_tokens} tokens (SGLang's "
                f"--max-total-tokens) cannot hold one call of the context it serves ({context} tokens); "
                "raise it, or pass a smaller --context-length in sglang_args"
            )


def served_context(section: EngineSection, model_dir: Path) -> int | None:
    """The context length SGLang serves: `--context-length` in `sglang_args`, else the model's (None for a
    model named by a hub id, not read here)."""
    args = list(section.sglang_args)
    for i, arg in enumerate(args):
        if arg.startswith("--context-length="):
            return int(arg.split("=", 1)[1])
        if arg == "--context-length" and i + 1 < len(args):
            return int(args[i + 1])
    served = Path(section.sglang_model_path or model_dir)
    return read_arch(served).max_position_embeddings if served.is_dir() else None


def _check_sglang_python(python: str) -> Path:
    """The directory of the sglang package `python` imports."""
    path = shutil.which(python) if "/" not in python else (python if Path(python).is_file() else None)
    if path is None:
        raise ConfigError(
            f"cell_agent.engine.sglang_python: {python!r} is not an interpreter on this machine; "
            "run `make setup` (it installs SGLang into .venv-sglang) and set .venv-sglang/bin/python"
        )
    try:
        found = subprocess.run([path, "-c", _FIND_SGLANG], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"cell_agent.engine.sglang_python: {python!r} does not run: {e}") from None
    if found.returncode != 0 or not found.stdout.strip():
        raise ConfigError(
            f"cell_agent.engine.sglang_python: {python!r} has no sglang installed; run `make setup` "
            "(it installs SGLang into .venv-sglang) and set .venv-sglang/bin/python"
        )
    return Path(found.stdout.strip().splitlines()[-1])


def sglang_model_modules(package: Path) -> dict[str, str]:
    """Architecture class → the `sglang.srt.models` module that serves it (its `EntryClass`), read from
    the sources without importing SGLang."""
    served: dict[str, str] = {}
    for source in sorted((package / "srt" / "models").glob("*.py")):
        match = _ENTRY_CLASS.search(source.read_text(errors="replace"))
        if match is not None:
            for name in re.findall(r"\w+", match.group(1)):
                served.setdefault(name, source.stem)
    return served


def _model_config(directory: Path, field: str) -> tuple[str, dict[str, object]]:
    """config.json's `architectures[0]` and the whole config (SGLang serves classes Gyre's own registry
    does not know)."""
    try:
        config = json.loads((directory / "config.json").read_text())
        archs = config.get("architectures")
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(
            f"{field}: {directory} is not a model directory SGLang can load: config.json: {e}"
        ) from None
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError(f"{field}: {directory}/config.json names no architectures; SGLang cannot load it")
    return archs[0], config


def _check_sglang_serves(section: EngineSection, model_dir: Path, package: Path) -> None:
    """A model directory SGLang serves here: its architecture has a module in `sglang.srt.models` that
    imports with this device's settings (a hub id is not read here)."""
    field = "cell_agent.engine.sglang_model_path" if section.sglang_model_path else "model.path"
    served = Path(section.sglang_model_path or model_dir)
    if not served.is_dir():
        return
    architecture, config = _model_config(served, field)
    module = sglang_model_modules(package).get(architecture)
    if module is None:
        raise ConfigError(
            f"{field}: SGLang cannot load {served}: no module of sglang.srt.models serves {architecture}"
        )
    source = (package / "srt" / "models" / f"{module}.py").read_text(errors="replace")
    if config.get("tie_word_embeddings") and "tie_word_embeddings" not in source:
        raise ConfigError(
            f"{field}: tie_word_embeddings: SGLang's {architecture} (sglang.srt.models.{module}) never ties "
            "lm_head to the embeddings, so it would serve an lm_head the checkpoint does not hold; untie "
            "the checkpoint (real checkpoints of this architecture are untied)"
        )
    env = {**os.environ, **({"SGLANG_USE_CPU_ENGINE": "1"} if section.sglang_device == "cpu" else {})}
    code = f"import importlib; importlib.import_module('sglang.srt.models.{module}')"
    try:
        done = subprocess.run(
            [section.sglang_python, "-c", code], capture_output=True, text=True, timeout=300, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(
            f"cell_agent.engine.sglang_python: importing sglang.srt.models.{module}: {e}"
        ) from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise ConfigError(
            f"{field}: SGLang cannot load {architecture} on {section.sglang_device}: sglang.srt.models.{module} "
            f"fails to import here ({lines[-1] if lines else f'exit {done.returncode}'})"
            + (
                "; a kernel the CPU shim does not supply (deploy/sglang/README.md)"
                if "sgl_kernel" in done.stderr
                else ""
            )
        )
