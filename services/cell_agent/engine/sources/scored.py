"""The `scored_script` output source: outputs come from a script, their log-probs from the served model.

A tiny random-init model does not call tools, spawn sub-agents or compact, so a CI run on it would
never exercise a harness's real traffic. This source fixes the *tokens* the engine emits to a script
(exactly as `scripted` does: `/gyre/script`, `engine.script_file`, `engine.script_repeat`) and
computes each scripted token's behaviour log-prob with the served weights, teacher-forced on the
request's own prompt: log_softmax(logits / T) of the prompt plus the scripted tokens, T the request's
(effective) temperature, with the request's LoRA adapter (`lora_path`) when it names one. Training on such a run sees real importance ratios π_θ / p_roll, weight
updates reach the scoring model, and the harness sees real tool calls — only the choice of tokens is
a stand-in for sampling. Use it where the harness, not the policy, is what the run must exercise.
On an MoE model the scoring forward also records each token's experts, which `return_routed_experts`
answers (routing replay).

    cell_agent: {engine: {output_source: scored_script, script_file: script.jsonl, script_repeat: true}}
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gyre.model.arch import ModelError
from gyre.model.causal_lm import CausalLM
from gyre.model.files import check_model_dir
from gyre.model.logprobs import effective_temperature, token_logprobs
from gyre.model.routing import ExpertRouting
from gyre.model.weights import assign_weights, load_model, load_state_dict
from services.cell_agent.engine.request import RequestState
from services.cell_agent.engine.sources.base import OutputSourceError, Sampled, SourceContext, StepPlan
from services.cell_agent.engine.sources.scripted import ScriptedSource


class ScoredScriptSource(ScriptedSource):
    name = "scored_script"
    scores_with_model = True
    serves_lora = True

    def __init__(self, *, model: CausalLM, **scripted: Any) -> None:
        super().__init__(**scripted)
        self._model = model.eval()
        self._routing: dict[RequestState, torch.Tensor] = {}
        """MoE models: the experts [prompt + script, L, k] of each scored request's tokens."""

    @classmethod
    def create(cls, ctx: SourceContext) -> ScoredScriptSource:
        model = ctx.model if isinstance(ctx.model, CausalLM) else load_model(ctx.model_dir)
        return cls(
            model=model,
            tokenizer=ctx.tokenizer,
            weight_version=ctx.weight_version,
            context_len=ctx.arch.max_position_embeddings,
            vocab_size=ctx.arch.vocab_size,
            script=ctx.script,
            eos_token_ids=ctx.eos_token_ids,
            repeat=ctx.section.script_repeat,
        )

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> list[Sampled]:
        for row in plan.rows:
            cursor = self._cursors[row.state]
            if not cursor.scored:
                prompt = row.state.tokens[: len(row.state.tokens) - row.state.num_output]
                ids = torch.tensor([*prompt, *cursor.tokens])
                adapter = row.state.adapter
                lora = (
                    self.adapters.adapter(adapter)
                    if adapter is not None and self.adapters is not None
                    else None
                )
                # the logits of the last prompt token and the scripted ones only: projecting a whole
                # prompt onto the vocabulary was ~30% of its forward (7K tokens, tiny Qwen3, CPU)
                moe = self._model.arch.moe
                routing = ExpertRouting() if moe is not None else None
                logits = self._model(
                    ids,
                    torch.arange(len(ids)),
                    [0, len(ids)],
                    lora=lora,
                    logits_from=max(len(prompt) - 1, 0),
                    routing=routing,
                )
                if routing is not None and moe is not None:
                    self._routing[row.state] = routing.stacked(
                        self._model.arch.num_layers, moe.num_experts_per_tok
                    )
                temperature = effective_temperature(row.state.request.sampling.temperature)
                scored = token_logprobs(logits[:-1], ids[len(prompt) :], temperature)
                cursor.logprobs = scored.tolist()
                cursor.scored = True
        return super().execute(plan)

    def routed_experts(self, state: RequestState) -> torch.Tensor | None:
        rows = self._routing.get(state)
        if rows is None:
            return None
        n = max(len(state.tokens) - 1, 0)
        out = torch.full((n, *rows.shape[1:]), -1, dtype=torch.int32)
        m = min(n, len(rows))
        out[:m] = rows[:m]
        return out

    def release(self, state: RequestState) -> None:
        if state.finished:  # a retracted request keeps its scored script, so its routing too
            self._routing.pop(state, None)
        super().release(state)

    @torch.no_grad()
    def update_weights(self, named_tensors: Mapping[str, torch.Tensor], weight_version: str | None) -> str:
        tied = self._model.arch.tie_word_embeddings
        tensors = {n: t for n, t in named_tensors.items() if not (tied and n == "lm_head.weight")}
        try:
            assign_weights(self._model, tensors, strict=False)
        except ValueError as e:
            raise OutputSourceError(str(e)) from e
        super().update_weights(tensors, weight_version)
        return f"Succeeded to update {len(tensors)} parameters (they score the scripted outputs)."

    def load_weights_from_disk(self, path: Path, weight_version: str | None) -> str:
        try:
            info = check_model_dir(Path(path))
        except ModelError as e:
            raise OutputSourceError(f"cannot load weights: {e}") from e
        if info.arch.fingerprint() != self._model.arch.fingerprint():
            raise OutputSourceError(f"{path} holds a different architecture than this engine serves")
        return self.update_weights(load_state_dict(info), weight_version)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "scores_with_model": 1}

    def model_info(self) -> dict[str, Any]:
        return {"model_path": None, "model_fingerprint": self._model.arch.fingerprint()}
