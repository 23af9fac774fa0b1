"""Registry of the embedded engine's output sources (see `base.py` for how to add one).

source = create_source("model", ctx)      # or "scripted", "scored_script"
"""

from __future__ import annotations

from services.cell_agent.engine.sources.base import OutputSource, OutputSourceError, SourceContext
from services.cell_agent.engine.sources.model import ModelSource
from services.cell_agent.engine.sources.scored import ScoredScriptSource
from services.cell_agent.engine.sources.scripted import ScriptedSource, ScriptEntry

OUTPUT_SOURCES: dict[str, type[OutputSource]] = {
    ModelSource.name: ModelSource,
    ScriptedSource.name: ScriptedSource,
    ScoredScriptSource.name: ScoredScriptSource,
}


def create_source(name: str, ctx: SourceContext) -> OutputSource:
    try:
        cls = OUTPUT_SOURCES[name]
    except KeyError:
        raise ValueError(
            f"unknown engine output source {name!r}; choose one of {sorted(OUTPUT_SOURCES)} "
            "(config field cell_agent.engine.output_source)"
        ) from None
    return cls.create(ctx)


__all__ = [
    "OUTPUT_SOURCES",
    "ModelSource",
    "OutputSource",
    "OutputSourceError",
    "ScoredScriptSource",
    "ScriptEntry",
    "ScriptedSource",
    "SourceContext",
    "create_source",
]
