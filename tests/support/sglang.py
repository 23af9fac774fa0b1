"""The real SGLang for tests: the interpreter `make setup` installs it into, and engine sections that
launch it on these CPUs.

    section = sglang_section(kv_cache_tokens=32768)     # fails under CI, skips elsewhere, if not installed

Tests start the real server (26–45 s on these CPUs): share one per module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gyre.config.engine import EngineSection
from gyre.paths import REPO_ROOT
from tests.support.sandboxes import unavailable

SGLANG_PYTHON = REPO_ROOT / ".venv-sglang" / "bin" / "python"


def sglang_python() -> Path:
    """The interpreter with SGLang (a failure under CI, a skip elsewhere, when `make setup` has not run)."""
    if not SGLANG_PYTHON.is_file():
        unavailable(f"SGLang is not installed ({SGLANG_PYTHON} is missing): run `make setup`")
    return SGLANG_PYTHON


def sglang_section(**overrides: Any) -> EngineSection:
    """An engine section that launches SGLang on CPU in float32 (exact against the trainer)."""
    fields: dict[str, Any] = {
        "backend": "sglang",
        "sglang_device": "cpu",
        "sglang_python": str(sglang_python()),
        "dtype": "float32",
        "max_batch_size": 8,
        **overrides,
    }
    return EngineSection(**fields)
