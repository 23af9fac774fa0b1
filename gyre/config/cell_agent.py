"""Config section of the cell agents: their ports, the engine hosted in the rollout role, the trainer
run in the training role, and the time limits of switching between the two."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gyre.config.base import Port, PositiveFloat, Section
from gyre.config.engine import EngineSection
from gyre.config.training import TrainerSection


class CellAgentSection(Section):
    ports: list[Port] = Field(default_factory=list)
    """gRPC port of each cell agent, index = cell; empty = free ports picked by `gyre up`."""
    engine_ports: list[Port] = Field(default_factory=list)
    """HTTP port of each cell's rollout engine, index = cell; empty = free ports picked by `gyre up`."""
    engine: EngineSection = Field(default_factory=EngineSection)
    """The rollout engine hosted in the rollout role."""
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    """The trainer run in the training role."""
    release_engine_weights: bool = False
    """On rollout → training, release the engine's weights too (not only its KV cache); they are
    reloaded from the newest published weights on the way back. Off on CPU, where the engine's
    copy is small; on GPUs turn it on to give the trainer the memory."""
    engine_ready_timeout_s: PositiveFloat = 60.0
    """How long a switch to rollout waits for the engine to serve (SGLang start-up included)."""
    publish_timeout_s: PositiveFloat = 120.0
    """Time limit of pushing weights to one rollout engine."""
    published_weights: Literal["core", "shared"] = "core"
    """Where a cell gets the published weights it loads (on its way back to rollout, and at start): `core` =
    streamed from the core over gRPC (`FetchPublished`) into the cell's own `<checkpoint root>/cells/<k>/`,
    so cells share no disk (per-cell compose volumes, Kubernetes ReadWriteOnce claims); `shared` = read
    where the core wrote them (every cell mounts the core's `trainer.checkpoint_dir`)."""

    @model_validator(mode="after")
    def _disk_publication_reads_the_core_directory(self) -> CellAgentSection:
        if self.trainer.publication == "disk" and self.published_weights != "shared":
            raise ValueError(
                "trainer.publication: disk has every engine read the core's published directory: set "
                "published_weights: shared (one volume mounted by every cell), or publication: tensor"
            )
        return self

    @model_validator(mode="after")
    def _engines_serve_the_adapter(self) -> CellAgentSection:
        """A run that trains a LoRA adapter has its engines serve adapters of its rank and targets."""
        lora = self.trainer.lora
        if lora is not None:
            engine = self.engine
            updates: dict[str, object] = {"enable_lora": True}
            if engine.max_lora_rank is None or engine.max_lora_rank < lora.rank:
                updates["max_lora_rank"] = lora.rank
            if not engine.lora_target_modules:
                updates["lora_target_modules"] = list(lora.target_modules)
            object.__setattr__(self, "engine", engine.model_copy(update=updates))
        return self
