"""Clients and launchers of rollout engines (the embedded engine and SGLang).

from gyre.engine import EngineClient            # async HTTP client, SGLang-native API
from gyre.engine.migration import migrate_request_kv
from gyre.engine.sglang_launcher import SGLangLauncher, build_sglang_command
"""

from gyre.engine.client import EngineClient
from gyre.engine.errors import (
    EngineConflict,
    EngineError,
    EngineNotFound,
    EngineRequestError,
    EngineServerError,
    EngineTimeout,
    EngineUnavailable,
)
from gyre.engine.types import FinishReason, GenerateChunk, GenerateResult, KVPinInfo

__all__ = [
    "EngineClient",
    "EngineConflict",
    "EngineError",
    "EngineNotFound",
    "EngineRequestError",
    "EngineServerError",
    "EngineTimeout",
    "EngineUnavailable",
    "FinishReason",
    "GenerateChunk",
    "GenerateResult",
    "KVPinInfo",
]
