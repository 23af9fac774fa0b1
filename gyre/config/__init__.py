"""One pydantic config tree for the whole run, loaded from YAML plus `GYRE_*` environment overrides.

    config = load_config(Path("gyre.yaml"))         # or load_config(None) for defaults
    GYRE_SCHEDULER__PHI=1.5 gyre config show         # nested keys joined by "__"

Bad values raise `ConfigError` whose one-line message names the field and the fix.

Sections live one concern per module: `infra` (run, NATS, Redis, log), `metrics`, `model`, `tasks`, `scheduler`,
`proxy`, `runner` (runner, evaluator and their sandboxes), `training` (objective, packer, trainer),
`engine`, `cell_agent`, `archive`; `base` holds the strict base model and the bounded field types (`AtLeastOne`, `Port`, ...).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from gyre.config.archive import ArchiveSection
from gyre.config.base import Section
from gyre.config.cell_agent import CellAgentSection
from gyre.config.engine import EngineSection
from gyre.config.infra import LogSection, NatsSection, RedisSection, RunSection
from gyre.config.metrics import MetricsSection
from gyre.config.model import ModelSection
from gyre.config.proxy import ProxySection
from gyre.config.runner import (
    EvaluatorSection,
    RunnerSandboxSection,
    RunnerSection,
    SandboxSection,
    VerifierSandboxSection,
)
from gyre.config.scheduler import SchedulerSection
from gyre.config.tasks import TasksSection
from gyre.config.tls import TlsSection
from gyre.config.training import ObjectiveSection, PackerSection, TrainerSection
from gyre.errors import ConfigError

__all__ = [
    "ArchiveSection",
    "CellAgentSection",
    "ConfigError",
    "EngineSection",
    "EvaluatorSection",
    "GyreConfig",
    "LogSection",
    "MetricsSection",
    "ModelSection",
    "NatsSection",
    "ObjectiveSection",
    "PackerSection",
    "ProxySection",
    "RedisSection",
    "RunSection",
    "RunnerSandboxSection",
    "RunnerSection",
    "SandboxSection",
    "SchedulerSection",
    "TasksSection",
    "TlsSection",
    "TrainerSection",
    "VerifierSandboxSection",
    "load_config",
]

ENV_PREFIX = "GYRE_"


class GyreConfig(Section):
    run: RunSection = Field(default_factory=RunSection)
    """The run: id, directory, bind address."""
    nats: NatsSection = Field(default_factory=NatsSection)
    """NATS JetStream (events and the command work queue)."""
    redis: RedisSection = Field(default_factory=RedisSection)
    """Redis (counters, trees, buffers, the micro-step queue)."""
    log: LogSection = Field(default_factory=LogSection)
    """Logging."""
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    """Prometheus `/metrics` of every service and the sinks of per-step training metrics."""
    model: ModelSection = Field(default_factory=ModelSection)
    """The embedded model."""
    tasks: TasksSection = Field(default_factory=TasksSection)
    """Where tasks come from and which ones the run dispatches (scheduler, runner and evaluator alike)."""
    objective: ObjectiveSection = Field(default_factory=ObjectiveSection)
    """The GSPO-variant loss."""
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    """The scheduler service and its policy."""
    proxy: ProxySection = Field(default_factory=ProxySection)
    """The harness-facing proxy."""
    runner: RunnerSection = Field(default_factory=RunnerSection)
    """The runner of harness executions."""
    evaluator: EvaluatorSection = Field(default_factory=EvaluatorSection)
    """The evaluator of preserved workspaces."""
    packer: PackerSection = Field(default_factory=PackerSection)
    """The stream packer."""
    cell_agent: CellAgentSection = Field(default_factory=CellAgentSection)
    """The cell agents (engine + trainer)."""
    archive: ArchiveSection = Field(default_factory=ArchiveSection)
    """Where trained groups go when they leave Redis (trees, records, outcomes, evaluations)."""
    tls: TlsSection = Field(default_factory=TlsSection)
    """Transport security between hosts (off: the embedded default on loopback)."""

    @model_validator(mode="after")
    def _profile_of_the_harness(self) -> GyreConfig:
        if self.scheduler.profile is None:
            harness = self.runner.harness
            self.scheduler.profile = harness if harness in ("claude_code", "codex") else "generic"
        return self

    @model_validator(mode="after")
    def _routing_recorded_for_replay(self) -> GyreConfig:
        engine = self.cell_agent.engine
        if (
            self.cell_agent.trainer.routing_replay
            and engine.backend == "sglang"
            and engine.sglang_device == "cpu"
        ):
            raise ValueError(
                "cell_agent.trainer.routing_replay: SGLang's CPU path cannot return routed experts "
                "(--enable-return-routed-experts: its RoutedExpertsCapturer pins host memory with "
                "cudaHostRegister and the server exits at start); replay routing on CPU with backend: embedded"
            )
        if self.cell_agent.trainer.routing_replay:
            self.proxy.record_routed_experts = True
            engine.return_routed_experts = True
        return self

    @model_validator(mode="after")
    def _tls_with_servers_of_its_own(self) -> GyreConfig:
        if not self.tls.enabled:
            return self
        if not self.nats.url or not self.redis.url:
            raise ValueError(
                "tls.enabled needs nats.url and redis.url: servers configured for TLS (the embedded stack "
                "starts plaintext ones on loopback)"
            )
        if not self.redis.url.startswith("rediss://"):
            raise ValueError(f"tls.enabled: redis.url must be rediss://…; got {self.redis.url!r}")
        return self

    @model_validator(mode="after")
    def _tls_world_with_tls(self) -> GyreConfig:
        if self.cell_agent.trainer.dist_backend == "tls" and not self.tls.enabled:
            raise ValueError(
                "cell_agent.trainer.dist_backend tls needs tls.enabled: true (its connections use the "
                "deployment's certificates, `gyre tls init`); or set dist_backend: gloo"
            )
        return self


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """`GYRE_A__B=v` → {"a": {"b": v}}; values are parsed as YAML scalars ("1.5", "true", "[a, b]")."""
    tree: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or "__" not in key:
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = yaml.safe_load(raw) if raw != "" else None
    return tree


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def _one_line(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "<root>"
    msg = first["msg"].removeprefix("Value error, ")
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{source}: {field}: {msg}{more}"


def load_config(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    base: Mapping[str, Any] | None = None,
) -> GyreConfig:
    """Resolve the config: defaults ← `base` ← YAML file ← `GYRE_*` environment ← `overrides`."""
    data: dict[str, Any] = {}
    source = str(path) if path else "config"
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"{path}: file not found") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from e
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections; got {type(loaded).__name__}")
        data = loaded or {}
    if base:
        data = _merge(dict(base), data)
    data = _merge(data, _env_overrides(os.environ if environ is None else environ))
    if overrides:
        data = _merge(data, overrides)
    try:
        return GyreConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(e, source)) from e
