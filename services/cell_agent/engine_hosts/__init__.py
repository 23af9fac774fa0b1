"""The rollout engine a cell hosts, by name (the config field `cell_agent.engine.backend`).

    base.py       EngineHost: what a host does across a role switch, and how to add one
    embedded.py   `embedded`: the embedded engine in this process
    http.py       an engine serving SGLang's native HTTP API at a URL (the base of `sglang`)
    sglang.py     `sglang`: an SGLang server launched and supervised by the cell

    host = create_engine_host(config.cell_agent.engine, model.path)
    await host.start()

The names are those of `gyre.engine.backends.ENGINE_BACKENDS` (what the config is checked against before
anything starts), and tests/integration/test_engine_backends.py runs the engine contract against every
host registered here.
"""

from __future__ import annotations

from pathlib import Path

from gyre.config.engine import EngineSection
from gyre.engine.backends import ENGINE_BACKENDS
from services.cell_agent.engine_hosts.base import EngineHost
from services.cell_agent.engine_hosts.embedded import EmbeddedEngineHost
from services.cell_agent.engine_hosts.http import HttpEngineHost
from services.cell_agent.engine_hosts.sglang import SGLangEngineHost

ENGINE_HOSTS: dict[str, type[EngineHost]] = {
    EmbeddedEngineHost.name: EmbeddedEngineHost,
    SGLangEngineHost.name: SGLangEngineHost,
}
"""name → host class; the names are `ENGINE_BACKENDS`'."""


def create_engine_host(
    section: EngineSection, model_dir: Path, *, log_path: Path | None = None
) -> EngineHost:
    """The host of `section.backend`; an engine in its own process writes its output to `log_path`."""
    try:
        cls = ENGINE_HOSTS[section.backend]
    except KeyError:
        raise ValueError(
            f"cell_agent.engine.backend {section.backend!r} has no engine host; "
            f"available: {', '.join(ENGINE_BACKENDS)}"
        ) from None
    return cls(section, model_dir, log_path=log_path)


__all__ = [
    "ENGINE_HOSTS",
    "EmbeddedEngineHost",
    "EngineHost",
    "HttpEngineHost",
    "SGLangEngineHost",
    "create_engine_host",
]
