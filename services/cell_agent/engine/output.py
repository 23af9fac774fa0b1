"""SGLang-shaped `/generate` responses: `text`, `output_ids`, `meta_info`.

    {"text": ..., "output_ids": [...],
     "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
                   "weight_version", "num_retractions", "e2e_latency",
                   "output_token_logprobs": [[logprob, token_id, text | null], ...]   # return_logprob
                   "input_token_logprobs": [],                                       # return_logprob
                   "routed_experts": base64 of int32 [prompt + completion - 1, L, k]}}  # return_routed_experts

As in SGLang, `output_ids` include a matched stop token while `text` does not (unless `no_stop_trim`),
and a matched stop string is cut from `text`. The token text in log-prob triples is null unless
`return_text_in_logprobs`.

Streaming has SGLang's two shapes: cumulative chunks (each repeats everything so far; SGLang's
default) or incremental chunks (`--incremental-streaming-output`: only what is new, including the
log-prob slice). While streaming, text that could be the start of a stop string is held back so a
later chunk never has to take text back.

`routed_experts` is SGLang's (`--enable-return-routed-experts`): the experts each decoder layer chose
for every token that went through a forward (the prompt and all outputs but the last), little-endian
int32 in base64, in the finished response only; -1 marks a dense layer or a token whose KV came from
elsewhere (an import).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import torch

from gyre.model.tokenizer import IncrementalDecoder, Tokenizer
from services.cell_agent.engine.request import RequestState


class OutputBuilder:
    def __init__(self, state: RequestState, tokenizer: Tokenizer, incremental: bool) -> None:
        self._state = state
        self._tokenizer = tokenizer
        self._incremental = incremental
        params = state.request.sampling
        self._decoder = IncrementalDecoder(tokenizer, skip_special_tokens=params.skip_special_tokens)
        self._decoded_ids = 0
        self._text = ""
        self._sent_ids = 0
        self._sent_text = ""

    def _decode_new(self) -> None:
        ids = self._state.output_ids
        if len(ids) > self._decoded_ids:
            self._text += self._decoder.feed(ids[self._decoded_ids :])
            self._decoded_ids = len(ids)

    def _stream_text(self) -> str:
        self._decode_new()
        text = self._text
        for stop in self._state.request.sampling.stop:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    text = text[:-k]
                    break
        return text

    def final_text(self) -> str:
        state = self._state
        params = state.request.sampling
        ids = state.output_ids
        reason = state.finish
        matched = reason.matched if reason is not None else None
        if isinstance(matched, int) and not params.no_stop_trim and ids and ids[-1] == matched:
            ids = ids[:-1]
        text = self._tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
        if isinstance(matched, str):
            pos = text.find(matched)
            if pos != -1:
                text = text[: pos + len(matched)] if params.no_stop_trim else text[:pos]
        return text

    def _meta(self, first: int, weight_version: str) -> dict[str, Any]:
        state = self._state
        meta: dict[str, Any] = {
            "id": state.rid,
            "finish_reason": state.finish.to_json() if state.finish is not None else None,
            "prompt_tokens": state.num_prompt,
            "completion_tokens": state.num_output,
            "cached_tokens": max(state.num_cached, 0),
            "weight_version": weight_version,
            "num_retractions": state.num_retractions,
            "e2e_latency": (state.finish_s or time.monotonic()) - state.arrival_s,
        }
        if state.request.return_logprob:
            with_text = state.request.return_text_in_logprobs
            ids = state.output_ids
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [
                [state.output_logprobs[i], ids[i], self._tokenizer.token_text(ids[i]) if with_text else None]
                for i in range(first, len(ids))
            ]
        if state.routed_experts is not None and state.finished:
            data = state.routed_experts.to(torch.int32).numpy().astype("<i4").tobytes()
            meta["routed_experts"] = base64.b64encode(data).decode("ascii")
        return meta

    def chunk(self, weight_version: str) -> dict[str, Any] | None:
        """The next streaming chunk, or None if nothing new happened."""
        state = self._state
        ids = state.output_ids
        if len(ids) == self._sent_ids and not state.finished:
            return None
        text = self.final_text() if state.finished else self._stream_text()
        first = self._sent_ids if self._incremental else 0
        out = {
            "text": text[len(self._sent_text) :] if self._incremental else text,
            "output_ids": ids[first:],
            "meta_info": self._meta(first, weight_version),
        }
        self._sent_ids = len(ids)
        self._sent_text = text
        return out

    def final(self, weight_version: str) -> dict[str, Any]:
        """The non-streaming response."""
        return {
            "text": self.final_text(),
            "output_ids": self._state.output_ids,
            "meta_info": self._meta(0, weight_version),
        }
