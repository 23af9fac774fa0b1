"""Typed results of the engine client, parsed from SGLang's `/generate` responses.

`GenerateResult` is one finished call; `GenerateChunk` is one streamed update, normalized so callers
never care whether the server streams cumulatively (SGLang's default) or incrementally
(`--incremental-streaming-output`): every chunk carries both the delta and the running totals.

`routed_experts` (asked with `return_routed_experts`) is SGLang's `meta_info.routed_experts`, the MoE
experts of every forwarded token — the prompt and every output but the last — per decoder layer:
base64 of little-endian int32 (SGLang 0.5) or a nested list (older servers), parsed to
[prompt + completion - 1, L·k] int32 (the model's L and k reshape it).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt


def parse_routed_experts(value: Any, num_tokens: int) -> npt.NDArray[np.int32] | None:
    """`meta_info.routed_experts` → [num_tokens, L·k] int32; None when absent. Raises ValueError on
    a payload that does not split into `num_tokens` rows."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except binascii.Error as e:
            raise ValueError(f"routed_experts is not base64: {e}") from e
        if len(raw) % 4:
            raise ValueError(f"routed_experts holds {len(raw)} bytes, not int32 values")
        flat = np.frombuffer(raw, dtype="<i4").astype(np.int32)
    else:
        flat = np.asarray(value, dtype=np.int32).reshape(-1)
    if num_tokens <= 0 or flat.size % num_tokens:
        raise ValueError(f"routed_experts holds {flat.size} ids, not a multiple of {num_tokens} tokens")
    return flat.reshape(num_tokens, -1)


def _routed(meta: dict[str, Any], prompt_tokens: int, completion_tokens: int) -> npt.NDArray[np.int32] | None:
    return parse_routed_experts(meta.get("routed_experts"), prompt_tokens + completion_tokens - 1)


@dataclass(frozen=True, slots=True)
class FinishReason:
    """SGLang's `meta_info.finish_reason`: why a generation ended. The client parses it (`from_json`), the
    embedded engine writes it (`to_json`); one type for both sides of the wire."""

    type: str
    """`stop`, `length` or `abort`."""
    matched: int | str | None = None
    """The stop token id or stop string that ended a `stop`."""
    length: int | None = None
    """The output length that ended a `length`."""
    message: str | None = None
    """Why an `abort` happened."""
    status_code: int | None = None
    """The HTTP status an `abort` maps to, when it is an error the caller must see (e.g. 400)."""

    @classmethod
    def stop(cls, matched: int | str) -> FinishReason:
        return cls("stop", matched=matched)

    @classmethod
    def max_length(cls, length: int) -> FinishReason:
        return cls("length", length=length)

    @classmethod
    def abort(cls, message: str, status_code: int | None = None) -> FinishReason:
        return cls("abort", message=message, status_code=status_code)

    @classmethod
    def from_json(cls, data: Any) -> FinishReason | None:
        if not isinstance(data, dict):
            return None
        return cls(
            type=str(data.get("type")),
            matched=data.get("matched"),
            length=data.get("length"),
            message=data.get("message"),
            status_code=data.get("status_code"),
        )

    def to_json(self) -> dict[str, Any]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        out: dict[str, Any] = {"type": "abort", "message": self.message}
        if self.status_code is not None:
            out["status_code"] = self.status_code
            out["err_type"] = None
        return out

    @property
    def aborted(self) -> bool:
        return self.type == "abort"


@dataclass(frozen=True, slots=True)
class GenerateResult:
    rid: str
    text: str
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    weight_version: str | None
    meta_info: dict[str, Any] = field(repr=False)
    routed_experts: npt.NDArray[np.int32] | None = field(default=None, repr=False)
    """[prompt_tokens + completion_tokens - 1, L·k] MoE experts per forwarded token (module doc)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GenerateResult:
        meta = data.get("meta_info") or {}
        triples = meta.get("output_token_logprobs") or []
        output_ids = list(data.get("output_ids") or [])
        prompt_tokens = int(meta.get("prompt_tokens") or 0)
        completion_tokens = int(meta.get("completion_tokens") or len(output_ids))
        return cls(
            rid=str(meta.get("id", "")),
            text=data.get("text") or "",
            output_ids=output_ids,
            output_logprobs=[float(t[0]) for t in triples],
            finish_reason=FinishReason.from_json(meta.get("finish_reason")),
            prompt_tokens=prompt_tokens,
            completion_tokens=int(meta.get("completion_tokens") or 0),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            weight_version=meta.get("weight_version"),
            meta_info=meta,
            routed_experts=_routed(meta, prompt_tokens, completion_tokens),
        )


@dataclass(frozen=True, slots=True)
class GenerateChunk:
    rid: str
    new_text: str
    new_output_ids: list[int]
    new_logprobs: list[float]
    text: str
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: FinishReason | None
    meta_info: dict[str, Any] = field(repr=False)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def routed_experts(self) -> npt.NDArray[np.int32] | None:
        """The finished chunk's `routed_experts` (module doc); None before the finish or when absent."""
        meta = self.meta_info
        prompt_tokens = int(meta.get("prompt_tokens") or 0)
        return _routed(meta, prompt_tokens, int(meta.get("completion_tokens") or len(self.output_ids)))

    def to_result(self) -> GenerateResult:
        meta = self.meta_info
        return GenerateResult(
            rid=self.rid,
            text=self.text,
            output_ids=list(self.output_ids),
            output_logprobs=list(self.output_logprobs),
            finish_reason=self.finish_reason,
            prompt_tokens=int(meta.get("prompt_tokens") or 0),
            completion_tokens=int(meta.get("completion_tokens") or len(self.output_ids)),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            weight_version=meta.get("weight_version"),
            meta_info=meta,
            routed_experts=self.routed_experts,
        )


@dataclass(frozen=True, slots=True)
class KVPinInfo:
    handle: str
    rid: str
    num_tokens: int
    weight_version: str


class StreamAccumulator:
    """Turns SGLang stream events (cumulative or incremental) into `GenerateChunk`s."""

    def __init__(self) -> None:
        self.text = ""
        self.output_ids: list[int] = []
        self.output_logprobs: list[float] = []

    def accept(self, event: dict[str, Any]) -> GenerateChunk:
        meta = event.get("meta_info") or {}
        ids = list(event.get("output_ids") or [])
        text = event.get("text") or ""
        triples = meta.get("output_token_logprobs") or []
        completion = meta.get("completion_tokens")
        # Cumulative chunks repeat everything: their id count equals completion_tokens. (On the first
        # chunk both readings agree.)
        cumulative = completion is None or (len(ids) == int(completion) and len(ids) >= len(self.output_ids))
        if cumulative:
            new_ids = ids[len(self.output_ids) :]
            new_text = text[len(self.text) :] if text.startswith(self.text) else text
            all_logprobs = [float(t[0]) for t in triples]
            new_logprobs = all_logprobs[len(self.output_logprobs) :]
            self.text = text
        else:
            new_ids, new_text = ids, text
            new_logprobs = [float(t[0]) for t in triples]
            self.text += text
        self.output_ids.extend(new_ids)
        self.output_logprobs.extend(new_logprobs)
        return GenerateChunk(
            rid=str(meta.get("id", "")),
            new_text=new_text,
            new_output_ids=new_ids,
            new_logprobs=new_logprobs,
            text=self.text,
            output_ids=list(self.output_ids),
            output_logprobs=list(self.output_logprobs),
            finish_reason=FinishReason.from_json(meta.get("finish_reason")),
            meta_info=meta,
        )
