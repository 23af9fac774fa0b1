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

_FIND_SGLANG = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('sglang') else 3)"


def check_engine(section: EngineSection, model_dir: Path) -> None:
    """`ConfigError` (one line naming the field) when `section.backend` is not registered or cannot start
    here: for `sglang`, an interpreter without sglang, or (on CPU) a KV budget smaller than the context it
    serves. SGLang itself starts with such a budget and refuses every call longer than the budget with a
    400, while it reports the full context length that callers size their calls by."""
    if section.backend not in ENGINE_BACKENDS:
        raise ConfigError(
            f"cell_agent.engine.backend: {section.backend!r} is not an engine backend; "
            f"choose one of {', '.join(ENGINE_BACKENDS)}"
        )
    if section.backend != "sglang":
        return
    _check_sglang_python(section.sglang_python)
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


def _check_sglang_python(python: str) -> None:
    path = shutil.which(python) if "/" not in python else (python if Path(python).is_file() else None)
    if path is None:
        raise ConfigError(
            f"cell_agent.engine.sglang_python: {python!r} is not an interpreter on this machine; "
            "run `make setup` (it installs SGLang into .venv-sglang) and set .venv-sglang/bin/python"
        )
    try:
        found = subprocess.run([path, "-c", _FIND_SGLANG], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"cell_agent.engine.sglang_python: {python!r} does not run: {e}") from None
    if not found:
        raise ConfigError(
            f"cell_agent.engine.sglang_python: {python!r} has no sglang installed; run `make setup` "
            "(it installs SGLang into .venv-sglang) and set .venv-sglang/bin/python"
        )
