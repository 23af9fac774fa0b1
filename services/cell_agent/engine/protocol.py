"""The SGLang-native request schema the embedded engine accepts, parsed and validated.

Field names and defaults follow SGLang's `GenerateReqInput` (managers/io_struct.py) and
`SamplingParams` (sampling/sampling_params.py): `rid`, `input_ids` (or `text`), `sampling_params`,
`return_logprob`, `return_text_in_logprobs`, `return_routed_experts`, `stream`; inside `sampling_params` `max_new_tokens`
(default 128), `temperature` (1.0; 0 = greedy), `top_p`, `top_k` (-1 = off), `min_p`, `stop`,
`stop_token_ids`, `ignore_eos`, `skip_special_tokens` (True), `no_stop_trim`, `sampling_seed`.

Anything SGLang accepts but this engine does not implement (batches, `n > 1`, penalties, grammars,
prompt log-probs) is refused with a 400 naming the field, never silently ignored; top-level keys that
only tune SGLang's bookkeeping (`log_metrics`, `priority`, ...) are ignored. Bad input raises
`RequestRefused`, which the HTTP layer maps to SGLang's `{"error": {"message": ...}}`.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gyre.model.tokenizer import Tokenizer

DEFAULT_MAX_NEW_TOKENS = 128

#: sampling_params keys that are accepted only at their neutral value.
_NEUTRAL_SAMPLING: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": None,
    "logit_bias": None,
    "custom_params": None,
}
_IGNORED_SAMPLING = {"spaces_between_special_tokens", "stream_interval"}

#: top-level keys accepted only at their neutral value (SGLang features this engine lacks).
_NEUTRAL_REQUEST: dict[str, Any] = {
    "input_embeds": None,
    "image_data": None,
    "video_data": None,
    "audio_data": None,
    "top_logprobs_num": 0,
    "token_ids_logprob": None,
    "session_params": None,
    "return_hidden_states": False,
}


class RequestRefused(ValueError):
    """A request the engine refuses (HTTP 400 by default)."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    rid: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_logprob: bool = False
    return_text_in_logprobs: bool = False
    stream: bool = False
    lora_name: str | None = None
    """The LoRA adapter to run on (SGLang's `lora_path`: the name it was loaded under); None = base."""
    return_routed_experts: bool = False
    """Answer the MoE experts of every token forwarded (`meta_info.routed_experts`, SGLang's format)."""


def check_token_ids(ids: Sequence[Any], vocab_size: int) -> None:
    """Refuse anything but ints in [0, vocab_size) (bools too). Checked at C speed — `map(type)` and
    `min`/`max` over the list — since a prompt is tens of thousands of ids and a per-id Python test
    was a third of the engine's CPU per request; the slow scan only finds the culprit to name it."""
    if set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < vocab_size:
        return
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise RequestRefused(f"input_ids must be token ids in [0, {vocab_size}); got {t!r}")


def _typed(name: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    # bool is an int in Python; SGLang's pydantic layer would refuse true for an int field too.
    if isinstance(value, bool) and kind is not bool and not (isinstance(kind, tuple) and bool in kind):
        raise RequestRefused(f"{name} must be {getattr(kind, '__name__', kind)}; got {value!r}")
    if not isinstance(value, kind):
        raise RequestRefused(f"{name} must be {getattr(kind, '__name__', kind)}; got {type(value).__name__}")
    return value


def parse_sampling_params(raw: Mapping[str, Any] | None, vocab_size: int) -> SamplingParams:
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, Mapping):
        raise RequestRefused(
            "sampling_params must be an object; a list means a batch, which is not supported"
        )
    known = {f for f in SamplingParams.__dataclass_fields__} | set(_NEUTRAL_SAMPLING) | _IGNORED_SAMPLING
    for key in raw:
        if key not in known:
            raise RequestRefused(f"sampling_params.{key} is not a sampling parameter")
    for key, neutral in _NEUTRAL_SAMPLING.items():
        if raw.get(key, neutral) not in (neutral, None):
            raise RequestRefused(
                f"sampling_params.{key}={raw[key]!r} is not supported by the embedded engine"
            )

    def get(name: str, default: Any) -> Any:
        value = raw.get(name)
        return default if value is None else value

    max_new_tokens = raw.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if max_new_tokens is not None and (_typed("max_new_tokens", max_new_tokens, int) < 0):
        raise RequestRefused(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
    temperature = float(_typed("temperature", get("temperature", 1.0), (int, float)))
    if not math.isfinite(temperature) or temperature < 0:
        raise RequestRefused(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = float(_typed("top_p", get("top_p", 1.0), (int, float)))
    if not 0.0 < top_p <= 1.0:
        raise RequestRefused(f"top_p must be in (0, 1], got {top_p}.")
    top_k = _typed("top_k", get("top_k", -1), int)
    if top_k < 1 and top_k != -1:
        raise RequestRefused(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    min_p = float(_typed("min_p", get("min_p", 0.0), (int, float)))
    if not 0.0 <= min_p <= 1.0:
        raise RequestRefused(f"min_p must be in [0, 1], got {min_p}.")
    stop_raw = get("stop", [])
    stop = [stop_raw] if isinstance(stop_raw, str) else _typed("stop", stop_raw, list)
    for s in stop:
        if not isinstance(s, str) or not s:
            raise RequestRefused(f"stop must be a string or a list of non-empty strings; got {s!r}")
    stop_ids = _typed("stop_token_ids", get("stop_token_ids", []), list)
    for t in stop_ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise RequestRefused(f"stop_token_ids must be token ids in [0, {vocab_size}); got {t!r}")
    seed = raw.get("sampling_seed")
    if seed is not None:
        _typed("sampling_seed", seed, int)
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        stop=tuple(stop),
        stop_token_ids=frozenset(stop_ids),
        ignore_eos=bool(_typed("ignore_eos", get("ignore_eos", False), bool)),
        skip_special_tokens=bool(_typed("skip_special_tokens", get("skip_special_tokens", True), bool)),
        no_stop_trim=bool(_typed("no_stop_trim", get("no_stop_trim", False), bool)),
        sampling_seed=seed,
    )


def parse_generate(body: Any, tokenizer: Tokenizer, vocab_size: int, max_seq_len: int) -> GenerateRequest:
    """Validate a `/generate` body into a `GenerateRequest` (raises `RequestRefused`)."""
    if not isinstance(body, Mapping):
        raise RequestRefused("the request body must be a JSON object")
    for key, neutral in _NEUTRAL_REQUEST.items():
        if body.get(key, neutral) not in (neutral, None, [], {}):
            raise RequestRefused(f"{key} is not supported by the embedded engine")
    if body.get("logprob_start_len") not in (None, -1):
        raise RequestRefused(
            "logprob_start_len >= 0 (prompt log-probs) is not supported by the embedded engine"
        )
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise RequestRefused("Either text or input_ids should be provided.")
    if input_ids is not None:
        ids = _typed("input_ids", input_ids, list)
        if not ids:
            raise RequestRefused("input_ids cannot be empty.")
        if isinstance(ids[0], list):
            raise RequestRefused(
                "batched input_ids (a list of lists) are not supported; send one request per call"
            )
        check_token_ids(ids, vocab_size)
    else:
        if not isinstance(text, str):
            raise RequestRefused("batched text (a list) is not supported; send one request per call")
        ids = tokenizer.encode(text)
        if not ids:
            raise RequestRefused("text cannot be empty.")
    rid = body.get("rid")
    if rid is None:
        rid = uuid.uuid4().hex
    elif not isinstance(rid, str) or not rid:
        raise RequestRefused(
            "rid must be a non-empty string (a list of rids means a batch, which is not supported)"
        )
    lora = body.get("lora_path")
    if lora is not None and (not isinstance(lora, str) or not lora):
        raise RequestRefused(
            "lora_path must be the name of a loaded adapter (a list means a batch, which is not supported)"
        )
    sampling = parse_sampling_params(body.get("sampling_params"), vocab_size)
    total = len(ids) + (sampling.max_new_tokens or 0)
    if len(ids) >= max_seq_len or total > max_seq_len:
        raise RequestRefused(
            f"Requested token count exceeds the model's maximum context length of {max_seq_len} tokens. "
            f"You requested a total of {total} tokens: {len(ids)} tokens from the input and "
            f"{sampling.max_new_tokens or 0} tokens for the completion. Please reduce the number of tokens "
            "in the input or the completion."
        )
    if sampling.max_new_tokens is None:
        sampling = SamplingParams(**{**_as_dict(sampling), "max_new_tokens": max_seq_len - len(ids)})
    return GenerateRequest(
        rid=rid,
        input_ids=tuple(ids),
        sampling=sampling,
        return_logprob=bool(body.get("return_logprob") or False),
        return_text_in_logprobs=bool(body.get("return_text_in_logprobs") or False),
        stream=bool(body.get("stream") or False),
        lora_name=lora,
        return_routed_experts=bool(body.get("return_routed_experts") or False),
    )


def _as_dict(params: SamplingParams) -> dict[str, Any]:
    return {name: getattr(params, name) for name in SamplingParams.__dataclass_fields__}
