"""Registry of the embedded engine's output sources (see `base.py` for how to add one).

backend = create_backend("model", ctx)      # or "scripted", "scored_script"
"""

from __future__ import annotations

from services.cell_agent.engine.backends.base import BackendContext, BackendError, EngineBackend
from services.cell_agent.engine.backends.model import ModelBackend
from services.cell_agent.engine.backends.scored import ScoredScriptBackend
from services.cell_agent.engine.backends.scripted import ScriptedBackend, ScriptEntry

BACKENDS: dict[str, type[EngineBackend]] = {
    ModelBackend.name: ModelBackend,
    ScriptedBackend.name: ScriptedBackend,
    ScoredScriptBackend.name: ScoredScriptBackend,
}


def create_backend(name: str, ctx: BackendContext) -> EngineBackend:
    try:
        cls = BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown engine output source {name!r}; choose one of {sorted(BACKENDS)} "
            "(config field cell_agent.engine.output_source)"
        ) from None
    return cls.create(ctx)


__all__ = [
    "BACKENDS",
    "BackendContext",
    "BackendError",
    "EngineBackend",
    "ModelBackend",
    "ScoredScriptBackend",
    "ScriptEntry",
    "ScriptedBackend",
    "create_backend",
]
