"""Registry of the embedded engine's output sources, by name (`cell_agent.engine.output_source`).

    check_output_source(section.output_source)  # cell agent start: ConfigError naming the field → exit 2
    source = create_source("model", ctx)        # or "scripted", "scored_script"

See `base.py` for the interface and how to add a source; tests/unit/engine/test_client_contract.py runs
the contract for every name here through the engine's HTTP API.
"""

from __future__ import annotations

from gyre.config import ConfigError
from services.cell_agent.engine.sources.base import OutputSource, OutputSourceError, SourceContext
from services.cell_agent.engine.sources.model import ModelSource
from services.cell_agent.engine.sources.scored import ScoredScriptSource
from services.cell_agent.engine.sources.scripted import ScriptedSource, ScriptEntry

OUTPUT_SOURCES: dict[str, type[OutputSource]] = {
    ModelSource.name: ModelSource,
    ScriptedSource.name: ScriptedSource,
    ScoredScriptSource.name: ScoredScriptSource,
}


SOURCE_FIELD = "cell_agent.engine.output_source"


def check_output_source(name: str) -> type[OutputSource]:
    """The source class registered as `name`; `ConfigError` naming the field otherwise."""
    try:
        return OUTPUT_SOURCES[name]
    except KeyError:
        raise ConfigError(
            f"config: {SOURCE_FIELD}: {name!r} is not an engine output source; "
            f"choose one of {', '.join(OUTPUT_SOURCES)}"
        ) from None


def create_source(name: str, ctx: SourceContext) -> OutputSource:
    return check_output_source(name).create(ctx)


__all__ = [
    "OUTPUT_SOURCES",
    "ModelSource",
    "OutputSource",
    "OutputSourceError",
    "ScoredScriptSource",
    "ScriptEntry",
    "ScriptedSource",
    "SourceContext",
    "check_output_source",
    "create_source",
]
