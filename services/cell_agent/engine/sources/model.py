"""The `model` output source: the checkpoint's forward over the paged KV pool, real sampling, real log-probs.

One step computes every running request's pending tokens: requests still in prefill get a chunk
(at most `max_prefill_tokens` prompt tokens per step in total), decoding requests get their last
sampled token. Prefill chunks and decode rows run as two batched forwards (so decode rows are not
padded to the chunk length); the rows whose pending tokens are now all computed sample one token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gyre.config.engine import EngineSection
from gyre.model.arch import ModelError
from gyre.model.causal_lm import CausalLM
from gyre.model.files import check_model_dir
from gyre.model.paged import PagedBatch
from gyre.model.routing import ExpertRouting
from gyre.model.weights import assign_weights, load_model, load_state_dict, torch_dtype
from services.cell_agent.engine.kv_store import KVStore
from services.cell_agent.engine.request import RequestState
from services.cell_agent.engine.sampler import sample
from services.cell_agent.engine.sources.base import (
    KVPin,
    OutputSource,
    OutputSourceError,
    Row,
    Sampled,
    SourceContext,
    StepPlan,
)


@dataclass(slots=True)
class _RowInput:
    """What the compute thread needs of a row, copied on the scheduling loop."""

    token_ids: list[int]
    block_table: list[int]
    start: int
    count: int
    rid: str
    adapter: str | None = None


class ModelSource(OutputSource):
    name = "model"
    serves_lora = True

    def __init__(
        self, *, section: EngineSection, model: CausalLM, weight_version: str, model_path: str | None = None
    ) -> None:
        self._dtype = torch_dtype(section.dtype)
        self._model: CausalLM | None = model.to(self._dtype).eval().fuse_projections()
        self._arch = model.arch
        self._version = weight_version
        self._num_updates = 0
        self._model_path = model_path
        self._max_prefill_tokens = section.max_prefill_tokens
        self._weights_backup_enabled = section.weights_cpu_backup
        self._weights_backup: dict[str, torch.Tensor] | None = None
        self._unloaded: set[str] = set()
        self._holders: set[RequestState] = set()
        self.store = KVStore(
            model.arch,
            num_tokens=section.kv_cache_tokens,
            block_size=section.block_size,
            enable_prefix_cache=section.enable_prefix_cache,
            dtype=self._dtype,
        )

    @classmethod
    def create(cls, ctx: SourceContext) -> ModelSource:
        """Serve `ctx.model` if given (updated in place by weight updates), else the model directory."""
        model = (
            ctx.model if ctx.model is not None else load_model(ctx.model_dir, torch_dtype(ctx.section.dtype))
        )
        if not isinstance(model, CausalLM):
            raise ValueError(f"the model output source serves a CausalLM; got {type(model).__name__}")
        return cls(
            section=ctx.section, model=model, weight_version=ctx.weight_version, model_path=str(ctx.model_dir)
        )

    # ---- properties --------------------------------------------------------------------------

    @property
    def weight_version(self) -> str:
        return self._version

    @property
    def cache_version(self) -> str:
        """Roots the prefix cache: changes on every weight update, even one that keeps the version."""
        return f"{self._version}#{self._num_updates}"

    def cache_key(self, state: RequestState) -> str:
        """The prefix-cache root of `state`: the weights' cache version and its adapter's `lora_id`."""
        return self.cache_version if state.adapter is None else f"{self.cache_version}|{state.adapter}"

    def set_weight_version(self, version: str) -> None:
        self._version = version

    @property
    def context_len(self) -> int:
        return self._arch.max_position_embeddings

    @property
    def vocab_size(self) -> int:
        return self._arch.vocab_size

    @property
    def ready(self) -> bool:
        return self._model is not None and not self._unloaded and self.store.resident

    @property
    def model(self) -> CausalLM:
        if self._model is None:
            raise OutputSourceError("model weights are released; call /resume_memory_occupation first", 503)
        return self._model

    # ---- scheduling --------------------------------------------------------------------------

    def admit(self, state: RequestState) -> bool:
        if not self.store.admit(state, self.cache_key(state)):
            return False
        self._holders.add(state)
        return True

    def prepare(self, running: Sequence[RequestState]) -> StepPlan:
        plan = StepPlan(payload=[])
        budget = self._max_prefill_tokens
        for state in running:
            start = state.num_computed
            pending = len(state.tokens) - start
            assert pending >= 1, f"{state.rid} has nothing to compute"
            count = 1 if pending == 1 else min(pending, budget)
            if count == 0:
                continue
            if not self.store.reserve(state, start + count):
                plan.starved.append(state)
                continue
            if pending > 1:
                budget -= count
            plan.rows.append(Row(state=state, start=start, count=count, samples=count == pending))
            plan.payload.append(
                _RowInput(
                    token_ids=state.tokens[start : start + count],
                    block_table=list(self.store.block_table(state)),
                    start=start,
                    count=count,
                    rid=state.rid,
                    adapter=state.adapter,
                )
            )
        plan.decode = all(row.count == 1 for row in plan.rows)
        return plan

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> list[Sampled]:
        model, cache = self.model, self.store.cache
        assert cache is not None
        inputs: list[_RowInput] = plan.payload
        sampled_rows: list[int] = []
        sampled_logits: list[torch.Tensor] = []  # per group: the logits of its sampling rows
        extend = [i for i, x in enumerate(inputs) if x.count > 1]
        decode = [i for i, x in enumerate(inputs) if x.count == 1]
        for group in (extend, decode):
            if not group:
                continue
            rows = [inputs[i] for i in group]
            width = max(x.count for x in rows)
            ids = torch.tensor([x.token_ids + [0] * (width - x.count) for x in rows], dtype=torch.long)
            batch = PagedBatch.from_block_tables(
                [x.block_table for x in rows],
                [x.start for x in rows],
                [x.count for x in rows],
                self.store.block_size,
                row_keys=[x.rid for x in rows],
            )
            last = torch.tensor([x.count - 1 for x in rows], dtype=torch.long)
            lora = self.adapters.bank.rows(x.adapter for x in rows) if self.adapters is not None else None
            routing = ExpertRouting() if self.store.routing is not None else None
            logits = model.forward_paged(ids, cache, batch, last_index=last, lora=lora, routing=routing)
            if routing is not None:
                self.store.record_routing(batch.write_slots, routing.chosen)
            picks = [b for b, i in enumerate(group) if plan.rows[i].samples]
            sampled_rows.extend(group[b] for b in picks)
            if picks:  # a decode group samples every row: its logits as they are, no copy
                sampled_logits.append(logits if len(picks) == len(group) else logits[picks])
        if not sampled_rows:
            return []
        states = [plan.rows[i].state for i in sampled_rows]
        tokens, logprobs = sample(
            sampled_logits[0] if len(sampled_logits) == 1 else torch.cat(sampled_logits),
            [s.request.sampling for s in states],
            [s.generator for s in states],
        )
        return [
            Sampled(state=s, token_id=t, logprob=lp)
            for s, t, lp in zip(states, tokens, logprobs, strict=True)
        ]

    def commit(self, plan: StepPlan) -> None:
        for row in plan.rows:
            row.state.num_computed = row.start + row.count
            self.store.register(row.state, self.cache_key(row.state))

    def routed_experts(self, state: RequestState) -> torch.Tensor | None:
        return self.store.routing_of(state)

    def release(self, state: RequestState) -> None:
        self.store.release(state, self.cache_key(state))
        self._holders.discard(state)

    # ---- weights -----------------------------------------------------------------------------

    @torch.no_grad()
    def update_weights(self, named_tensors: Mapping[str, torch.Tensor], weight_version: str | None) -> str:
        if self._model is None:
            raise OutputSourceError(
                "model weights are released; resume_memory_occupation(tags=['weights']) first"
            )
        params = dict(self._model.named_parameters())
        named_tensors = {
            n: t
            for n, t in named_tensors.items()
            if not (n == "lm_head.weight" and self._arch.tie_word_embeddings)
        }
        for name, tensor in named_tensors.items():
            if name not in params:
                raise OutputSourceError(
                    f"unknown parameter {name!r}; this engine serves {self._arch.architecture} with Hugging Face "
                    "names such as 'model.embed_tokens.weight'"
                )
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise OutputSourceError(
                    f"parameter {name!r} has shape {tuple(tensor.shape)}, expected {tuple(params[name].shape)}"
                )
        for name, tensor in named_tensors.items():
            params[name].copy_(tensor.to(params[name].dtype))
            self._unloaded.discard(name)
        self._num_updates += 1
        if weight_version is not None:
            self._version = weight_version
        return f"Succeeded to update {len(named_tensors)} parameters."

    def load_weights_from_disk(self, path: Path, weight_version: str | None) -> str:
        """Load every parameter of a Hugging Face model directory (SGLang's `model_path`)."""
        try:
            info = check_model_dir(Path(path))
        except ModelError as e:
            raise OutputSourceError(f"cannot load weights: {e}") from e
        if info.arch.fingerprint() != self._arch.fingerprint():
            raise OutputSourceError(
                f"{path} holds a different architecture ({info.arch.architecture}, {info.arch.num_layers} layers, "
                f"hidden {info.arch.hidden_size}) than this engine serves"
            )
        tensors = load_state_dict(info, self._dtype)
        self._model_path = str(path)
        return self.update_weights(tensors, weight_version)

    def flush_cache(self) -> int:
        return self.store.flush()

    def release_memory(self, tags: Sequence[str]) -> None:
        assert not self._holders, "release_memory with requests holding KV"
        if "kv_cache" in tags:
            self.store.drop()
        if "weights" in tags and self._model is not None:
            if self._weights_backup_enabled:
                self._weights_backup = {n: p.detach().clone() for n, p in self._model.named_parameters()}
            self._model = None

    def resume_memory(self, tags: Sequence[str]) -> None:
        if "kv_cache" in tags:
            self.store.allocate()
        if "weights" in tags and self._model is None:
            model = CausalLM(self._arch).to(self._dtype).eval().fuse_projections()
            if self._weights_backup is not None:
                assign_weights(model, self._weights_backup)
                self._weights_backup = None
            else:
                self._unloaded = {n for n, _ in model.named_parameters()}
            self._model = model

    # ---- migration and info ------------------------------------------------------------------

    def pin(self, state: RequestState) -> KVPin:
        adapter = (
            "" if state.adapter is None or self.adapters is None else self.adapters.name_of(state.adapter)
        )
        return self.store.pin(state, self.cache_key(state), self._version, adapter)

    def export_kv(self, handle: str) -> bytes:
        return self.store.export(handle)

    def import_kv(self, payload: bytes) -> int:
        return self.store.import_(payload, self._import_root, self._version)

    def _import_root(self, adapter_name: str) -> str | None:
        """The cache root KV computed under the adapter `adapter_name` ("" = none) goes under here, or
        None when this engine does not serve that adapter."""
        if not adapter_name:
            return self.cache_version
        lora_id = self.adapters.id_of(adapter_name) if self.adapters is not None else None
        return None if lora_id is None else f"{self.cache_version}|{lora_id}"

    def unpin(self, handle: str) -> None:
        self.store.unpin(handle)

    def stats(self) -> dict[str, Any]:
        return {
            **self.store.stats(),
            **(self.adapters.stats() if self.adapters is not None else {}),
            "weights_resident": int(self._model is not None),
            "weights_loaded": int(self._model is not None and not self._unloaded),
        }

    def model_info(self) -> dict[str, Any]:
        return {"model_path": self._model_path, "model_fingerprint": self._arch.fingerprint()}
