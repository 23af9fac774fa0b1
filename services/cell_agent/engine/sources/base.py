"""The extension point of the embedded engine: where the next token of each request comes from.

The engine core (`core.py`) owns requests (queues, continuous batching, stop rules, streaming,
pause/abort); an output source owns everything the outputs are computed from (weights, KV blocks, a
script). One step:

    plan = source.prepare(running)       # scheduling loop: claim resources for this step's rows
    out  = source.execute(plan)          # compute thread: forward + sample, nothing else
    source.commit(plan)                  # scheduling loop: record progress (e.g. cache full blocks)

To add an output source: subclass `OutputSource`, set `name`, implement `create` and the other
abstract methods, and add the class to `OUTPUT_SOURCES` in `sources/__init__.py`; the engine picks it
by the config field `cell_agent.engine.output_source`, and the contract tests in
tests/unit/engine/test_client_contract.py run every registered source through the same HTTP API.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from gyre.config.engine import EngineSection
from gyre.engine.types import FinishReason
from gyre.model.arch import ModelArch
from gyre.model.tokenizer import Tokenizer
from services.cell_agent.engine.adapters import EngineAdapters
from services.cell_agent.engine.request import RequestState

#: Memory tags of `/release_memory_occupation` (SGLang's names); None in a request means all.
MEMORY_TAGS = ("kv_cache", "weights")


class OutputSourceError(ValueError):
    """A control operation the source refuses; `status_code` is the HTTP status to answer with."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass(slots=True)
class Row:
    """One request in one step: process `tokens[start:start+count]`; sample if that completes it."""

    state: RequestState
    start: int
    count: int
    samples: bool


@dataclass(slots=True)
class StepPlan:
    rows: list[Row] = field(default_factory=list)
    starved: list[RequestState] = field(default_factory=list)
    payload: Any = None
    decode: bool = False
    """Set by a source whose step computes one token per row and nothing more (no prefill, no scoring):
    such a step's cost is steady from step to step, so the core may run it on its event loop."""


@dataclass(slots=True)
class Sampled:
    """One new token; `finish` lets a source end the request after it (the scripted source does
    at the end of its script) when the scheduler's own stop rules do not."""

    state: RequestState
    token_id: int
    logprob: float
    finish: FinishReason | None = None


@dataclass(slots=True)
class SourceContext:
    """Everything a source may be built from; `create` picks what it needs."""

    section: EngineSection
    model_dir: Path
    arch: ModelArch
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    """The model's stop ids, end of turn first (generation_config.json, then config.json)."""
    weight_version: str
    model: Any = None
    script: Sequence[Any] = ()


@dataclass(frozen=True, slots=True)
class KVPin:
    handle: str
    rid: str
    num_tokens: int
    weight_version: str


class OutputSource(ABC):
    """Base class of output sources. Methods run on the scheduling loop unless noted."""

    name: ClassVar[str]
    #: `/health_generate` probes by generating one token (a scripted source would spend an entry).
    probe_by_generation: ClassVar[bool] = True
    #: Computes outputs with the served model, so a request's LoRA adapter (`lora_path`) applies to it.
    serves_lora: ClassVar[bool] = False
    adapters: EngineAdapters | None = None
    """The LoRA adapters served (set by the engine when `enable_lora` and the source `serves_lora`)."""

    def set_weight_version(self, version: str) -> None:
        """SGLang's `/update_weight_version`: report `version` from now on, weights unchanged (a
        publication that loaded an adapter)."""
        raise OutputSourceError(f"the {self.name} output source cannot change its weight version")

    @classmethod
    @abstractmethod
    def create(cls, ctx: SourceContext) -> OutputSource:
        """Build the source from the engine's context (config, tokenizer, optional model/script)."""

    @property
    @abstractmethod
    def weight_version(self) -> str: ...

    @property
    @abstractmethod
    def context_len(self) -> int: ...

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def ready(self) -> bool:
        """Weights and KV memory are resident: requests may be admitted."""

    @abstractmethod
    def admit(self, state: RequestState) -> bool:
        """Claim what `state` needs to start (KV for its uncached tokens); False = not now. Sets
        `state.num_computed` (prefix-cache hit) and `state.kv_version`. Raises `RequestRefused` or
        `OutputSourceError` for a request that can never be served (it is then failed, not retried)."""

    @abstractmethod
    def prepare(self, running: Sequence[RequestState]) -> StepPlan: ...

    @abstractmethod
    def execute(self, plan: StepPlan) -> list[Sampled]:
        """Compute thread: run the step, sample one token for every row with `samples`."""

    @abstractmethod
    def commit(self, plan: StepPlan) -> None: ...

    @abstractmethod
    def release(self, state: RequestState) -> None:
        """`state` finished, aborted or was retracted: free its resources (caching what is reusable)."""

    @abstractmethod
    def update_weights(self, named_tensors: Mapping[str, torch.Tensor], weight_version: str | None) -> str:
        """Load (a subset of) parameters by name; returns a message. Raises `OutputSourceError`."""

    @abstractmethod
    def load_weights_from_disk(self, path: Path, weight_version: str | None) -> str: ...

    @abstractmethod
    def flush_cache(self) -> int:
        """Drop the prefix cache; returns the number of entries dropped."""

    @abstractmethod
    def release_memory(self, tags: Sequence[str]) -> None: ...

    @abstractmethod
    def resume_memory(self, tags: Sequence[str]) -> None: ...

    @abstractmethod
    def pin(self, state: RequestState) -> KVPin:
        """Hold the KV blocks of `state`'s computed tokens until `unpin`."""

    @abstractmethod
    def export_kv(self, handle: str) -> bytes: ...

    @abstractmethod
    def import_kv(self, payload: bytes) -> int:
        """Adopt exported KV into this engine's prefix cache; returns the tokens it covers."""

    @abstractmethod
    def unpin(self, handle: str) -> None: ...

    @abstractmethod
    def stats(self) -> dict[str, Any]: ...

    def routed_experts(self, state: RequestState) -> torch.Tensor | None:
        """The MoE experts [len(tokens) - 1, L, k] (int32, -1 where unknown) of every token of `state`
        forwarded so far, as SGLang's `return_routed_experts` answers them; None: this source serves
        no MoE model. Called before `release`."""
        return None

    def model_info(self) -> dict[str, Any]:
        return {"model_path": None}
