"""The life of one request inside the engine: its tokens, log-probs, KV progress and finish reason.

A request is WAITING (queued, holds no KV), RUNNING (admitted: holds KV for `num_computed` of its
tokens) or FINISHED. `tokens` is prompt + outputs; every step processes `tokens[num_computed:]` (the
uncached prompt on the first steps, the last sampled token afterwards) and samples one new token once
all of them are computed. A retracted request goes back to WAITING with its outputs kept and is
recomputed (mostly from the prefix cache) when admitted again.

Finish reasons serialize exactly as SGLang's `FINISH_*` classes (managers/schedule_batch.py):
`{"type": "stop", "matched": id | str}`, `{"type": "length", "length": n}`,
`{"type": "abort", "message": ..., "status_code": ..., "err_type": ...}`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gyre.engine.types import FinishReason
from services.cell_agent.engine.protocol import GenerateRequest


class Phase(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class RequestState:
    """Mutable state of one request; touched only by the scheduling loop (and, for the generator and
    the snapshot a plan took, by the compute thread while a step runs)."""

    request: GenerateRequest
    generator: torch.Generator
    notify: Callable[[], None]
    tokens: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    phase: Phase = Phase.WAITING
    finish: FinishReason | None = None
    error: Exception | None = None
    num_computed: int = 0
    num_cached: int = -1
    kv_version: str | None = None
    adapter: str | None = None
    """The `lora_id` of the LoRA adapter the request runs on (its `lora_path`), None for the base model."""
    num_retractions: int = 0
    admit_seq: int = 0
    backend_state: Any = None
    routed_experts: torch.Tensor | None = None
    """[len(tokens) - 1, L, k] int32 experts of every forwarded token, taken at the finish when the
    request asked `return_routed_experts` and the source serves an MoE model (-1: not known)."""
    arrival_s: float = field(default_factory=time.monotonic)
    first_token_s: float | None = None
    finish_s: float | None = None

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.request.input_ids)

    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def num_prompt(self) -> int:
        return len(self.request.input_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FINISHED

    def append(self, token_id: int, logprob: float) -> None:
        self.tokens.append(token_id)
        self.output_logprobs.append(logprob)
        if self.first_token_s is None:
            self.first_token_s = time.monotonic()

    def set_finished(self, reason: FinishReason) -> None:
        assert self.phase is not Phase.FINISHED, f"{self.rid} finished twice"
        self.phase = Phase.FINISHED
        self.finish = reason
        self.finish_s = time.monotonic()
        self.notify()

    def fail(self, error: Exception) -> None:
        """Finish with an error raised before any output (answered as an HTTP error)."""
        self.error = error
        self.set_finished(FinishReason.abort(str(error), status_code=getattr(error, "status_code", 400)))
