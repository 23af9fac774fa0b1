"""The `scripted` output source: outputs come from a queue of scripted answers, not from a model.

Used where the harness, not the model, is under test (the proxy's conformance runs with the real
Claude Code / Codex CLIs): the test queues the exact assistant turns it wants, through the
constructor or `POST /gyre/script`, and the engine serves them through the same SGLang-native API
(streaming, abort, pause, KV pin/export/import) as the model source.

An entry is `{"text": ...}`, `{"output_ids": [...]}` or `{"choices": [text, ...]}`, plus optional
`rid` (served only to that request id; entries without `rid` are served first-in first-out), `when`,
`finish` (`stop`, the default, or `length`), `stop_token_id`, `logprobs` and `token_interval_s` (a
delay per token, to make a stream slow enough to abort or pause).

An entry with `when` (a regex) is a *rule*, not a queue item: it answers every request whose decoded
prompt (special tokens kept) it matches (`re.search`) and is never used up. Rules make a scripted
agent stateless — each turn is chosen from the conversation itself, so interleaved executions,
sub-agents and calls rerouted to another engine all get the turn their history calls for. A rule's
`choices` are alternative answers; a request gets `choices[crc32(rid) % n]`, so the members of a
group can act differently (and earn different rewards) while each call stays reproducible. Requests
take, in order: an entry for their `rid`, else the first queued entry without `when`, else the first
rule that matches. `text` is encoded by the model's tokenizer, so special-token strings
in it (`<tool_call>`, `<|im_end|>`, ...) become their ids. With `finish: stop` the terminator is
appended unless the tokens already end in a stop token: `stop_token_id`, else the request's smallest
`stop_token_ids`, else the model's first stop id (its end of turn).

Log-prob rule: token i of an entry reports `logprobs[i]` if given, else `scripted_logprob(i)` =
-0.01 * (1 + i % 100), distinct per position so a test can check alignment.

"KV" is notional: a pin covers the tokens the request has processed, an export carries no tensors,
and an import makes later requests report the covered prefix as `cached_tokens`.
"""

from __future__ import annotations

import itertools
import re
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from gyre.engine.types import FinishReason
from gyre.model.tokenizer import Tokenizer
from services.cell_agent.engine.kv_transfer import KVPayload, decode_kv, encode_kv
from services.cell_agent.engine.protocol import RequestRefused
from services.cell_agent.engine.request import RequestState
from services.cell_agent.engine.sources.base import (
    KVPin,
    OutputSource,
    OutputSourceError,
    Row,
    Sampled,
    SourceContext,
    StepPlan,
)

FINGERPRINT = "scripted"


def scripted_logprob(index: int) -> float:
    """The log-prob reported for token `index` of a scripted output without explicit log-probs."""
    return -0.01 * (1 + index % 100)


@dataclass(frozen=True, slots=True)
class ScriptEntry:
    output_ids: tuple[int, ...] | None = None
    text: str | None = None
    rid: str | None = None
    finish: str = "stop"
    stop_token_id: int | None = None
    logprobs: tuple[float, ...] | None = None
    token_interval_s: float = 0.0
    when: str | None = None
    """A regex over the decoded prompt: the entry is a rule (see the module docstring)."""
    choices: tuple[str, ...] | None = None

    def matches(self, rid: str, prompt: Callable[[], str]) -> bool:
        if self.rid is not None and self.rid != rid:
            return False
        return self.when is None or re.search(self.when, prompt()) is not None

    def text_for(self, rid: str) -> str | None:
        if self.choices is not None:
            return self.choices[zlib.crc32(rid.encode()) % len(self.choices)]
        return self.text

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScriptEntry:
        allowed = set(cls.__dataclass_fields__)
        unknown = set(data) - allowed
        if unknown:
            raise RequestRefused(f"unknown script entry keys {sorted(unknown)}; allowed: {sorted(allowed)}")
        if sum(data.get(k) is not None for k in ("text", "output_ids", "choices")) != 1:
            raise RequestRefused("a script entry needs exactly one of 'text', 'output_ids' or 'choices'")
        choices = data.get("choices")
        if choices is not None and (
            not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices)
        ):
            raise RequestRefused("script entry 'choices' must be a non-empty list of strings")
        if data.get("when") is not None:
            try:
                re.compile(str(data["when"]))
            except re.error as e:
                raise RequestRefused(f"script entry 'when' is not a regex: {e}") from e
        if data.get("finish", "stop") not in ("stop", "length"):
            raise RequestRefused(
                f"script entry finish must be 'stop' or 'length'; got {data.get('finish')!r}"
            )
        if data.get("finish") == "length" and not (data.get("text") or data.get("output_ids")):
            raise RequestRefused("a script entry with finish 'length' needs at least one token")
        ids = data.get("output_ids")
        logprobs = data.get("logprobs")
        try:
            return cls(
                output_ids=tuple(int(t) for t in ids) if ids is not None else None,
                text=str(data["text"]) if data.get("text") is not None else None,
                rid=str(data["rid"]) if data.get("rid") is not None else None,
                finish=str(data.get("finish", "stop")),
                stop_token_id=int(data["stop_token_id"]) if data.get("stop_token_id") is not None else None,
                logprobs=tuple(float(x) for x in logprobs) if logprobs is not None else None,
                token_interval_s=float(data.get("token_interval_s") or 0.0),
                when=str(data["when"]) if data.get("when") is not None else None,
                choices=tuple(choices) if choices is not None else None,
            )
        except (TypeError, ValueError) as e:
            raise RequestRefused(f"malformed script entry: {e}") from e


@dataclass(slots=True)
class _Cursor:
    tokens: list[int]
    logprobs: list[float]
    finish_length: bool
    interval_s: float
    scored: bool = True
    """False until a source that scores scripted tokens has filled `logprobs` (scored_script)."""


@dataclass(slots=True)
class _Pin:
    rid: str
    token_ids: tuple[int, ...]


class ScriptedSource(OutputSource):
    name = "scripted"
    probe_by_generation = False
    scores_with_model: ClassVar[bool] = False
    """Subclasses that compute the log-probs of scripted tokens with a model set this."""

    def __init__(
        self,
        *,
        tokenizer: Tokenizer,
        weight_version: str,
        context_len: int,
        vocab_size: int,
        script: Sequence[ScriptEntry | Mapping[str, Any]] = (),
        eos_token_ids: Sequence[int] = (),
        repeat: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._version = weight_version
        self._context_len = context_len
        self._vocab_size = vocab_size
        self._eos = frozenset(eos_token_ids)
        self._default_stop = eos_token_ids[0] if eos_token_ids else None
        self._queue: deque[ScriptEntry] = deque()
        self._cursors: dict[RequestState, _Cursor] = {}
        self._imported: set[tuple[int, ...]] = set()
        self._pins: dict[str, _Pin] = {}
        self._handles = itertools.count(1)
        self._released: set[str] = set()
        self._served = 0
        self.add_script(script)
        self._repeat = tuple(e for e in self._queue if e.when is None) if repeat else ()

    @classmethod
    def create(cls, ctx: SourceContext) -> ScriptedSource:
        return cls(
            tokenizer=ctx.tokenizer,
            weight_version=ctx.weight_version,
            context_len=ctx.arch.max_position_embeddings,
            vocab_size=ctx.arch.vocab_size,
            script=ctx.script,
            eos_token_ids=ctx.eos_token_ids,
            repeat=ctx.section.script_repeat,
        )

    # ---- the script --------------------------------------------------------------------------

    def add_script(self, entries: Sequence[ScriptEntry | Mapping[str, Any]], replace: bool = False) -> int:
        parsed = [e if isinstance(e, ScriptEntry) else ScriptEntry.from_json(e) for e in entries]
        if replace:
            self._queue.clear()
        self._queue.extend(parsed)
        return len(self._queue)

    def script_status(self) -> dict[str, Any]:
        rules = sum(e.when is not None for e in self._queue)
        return {"queued": len(self._queue) - rules, "rules": rules, "served": self._served}

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text)

    def _take(self, rid: str, prompt: Callable[[], str]) -> ScriptEntry:
        for i, entry in enumerate(self._queue):
            if entry.rid == rid and entry.when is None:
                del self._queue[i]
                return entry
        for i, entry in enumerate(self._queue):
            if entry.rid is None and entry.when is None:
                del self._queue[i]
                return entry
        for entry in self._queue:
            if entry.when is not None and entry.matches(rid, prompt):
                return entry
        if self._repeat:  # the configured script starts over (`engine.script_repeat`)
            self._queue.extend(self._repeat)
            return self._take(rid, prompt)
        raise RequestRefused(
            f"no scripted output is queued for request {rid!r}; POST entries to /gyre/script"
        )

    # ---- properties --------------------------------------------------------------------------

    @property
    def weight_version(self) -> str:
        return self._version

    @property
    def context_len(self) -> int:
        return self._context_len

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def ready(self) -> bool:
        return not self._released

    # ---- scheduling --------------------------------------------------------------------------

    def admit(self, state: RequestState) -> bool:
        if state not in self._cursors:
            prompt_ids = state.tokens[: len(state.tokens) - state.num_output]
            decoded: list[str] = []

            def prompt() -> str:  # decoded once, only if a rule asks
                if not decoded:
                    decoded.append(self._tokenizer.decode(prompt_ids))
                return decoded[0]

            entry = self._take(state.rid, prompt)
            self._served += 1
            tokens = (
                list(entry.output_ids)
                if entry.output_ids is not None
                else self._encode(entry.text_for(state.rid) or "")
            )
            stops = self._eos | state.request.sampling.stop_token_ids
            if entry.finish == "stop" and not (tokens and tokens[-1] in stops):
                if entry.stop_token_id is not None:
                    terminator = entry.stop_token_id
                elif state.request.sampling.stop_token_ids:
                    terminator = min(state.request.sampling.stop_token_ids)
                elif self._default_stop is not None:
                    terminator = self._default_stop
                else:
                    raise RequestRefused(
                        "the scripted entry needs stop_token_id: the model declares no stop ids"
                    )
                tokens.append(terminator)
            logprobs = list(entry.logprobs) if entry.logprobs is not None else []
            logprobs += [scripted_logprob(i) for i in range(len(logprobs), len(tokens))]
            self._cursors[state] = _Cursor(
                tokens,
                logprobs,
                entry.finish == "length",
                entry.token_interval_s,
                scored=entry.logprobs is not None or not self.scores_with_model,
            )
        state.num_computed = 0
        covered = max((len(p) for p in self._imported if tuple(state.tokens[: len(p)]) == p), default=0)
        covered = min(covered, len(state.tokens) - 1)
        if state.num_cached < 0:
            state.num_cached = covered
        state.kv_version = self._version
        return True

    def prepare(self, running: Sequence[RequestState]) -> StepPlan:
        plan = StepPlan()
        for state in running:
            pending = len(state.tokens) - state.num_computed
            plan.rows.append(Row(state=state, start=state.num_computed, count=pending, samples=True))
        return plan

    def execute(self, plan: StepPlan) -> list[Sampled]:
        cursors = [self._cursors[row.state] for row in plan.rows]
        delay = max((c.interval_s for c in cursors), default=0.0)
        if delay > 0:
            time.sleep(delay)
        out = []
        for row, cursor in zip(plan.rows, cursors, strict=True):
            i = row.state.num_output
            finish = None
            if i == len(cursor.tokens) - 1:
                # The script ends here whatever the request's stop rules say.
                last = cursor.tokens[i]
                finish = (
                    FinishReason.max_length(len(cursor.tokens))
                    if cursor.finish_length
                    else FinishReason.stop(last)
                )
            out.append(Sampled(row.state, cursor.tokens[i], cursor.logprobs[i], finish))
        return out

    def commit(self, plan: StepPlan) -> None:
        for row in plan.rows:
            row.state.num_computed = row.start + row.count

    def release(self, state: RequestState) -> None:
        if state.finished:
            self._cursors.pop(state, None)

    # ---- weights and memory (notional) -------------------------------------------------------

    def set_weight_version(self, version: str) -> None:
        self._version = version

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor], weight_version: str | None) -> str:
        if weight_version is not None:
            self._version = weight_version
        return f"Scripted source: accepted {len(named_tensors)} tensors (not used)."

    def load_weights_from_disk(self, path: Path, weight_version: str | None) -> str:
        if not Path(path).exists():
            raise OutputSourceError(f"{path} does not exist")
        return self.update_weights({}, weight_version)

    def flush_cache(self) -> int:
        n = len(self._imported)
        self._imported.clear()
        return n

    def release_memory(self, tags: Sequence[str]) -> None:
        self._released |= set(tags)
        if "kv_cache" in tags:
            self._imported.clear()
            self._pins.clear()

    def resume_memory(self, tags: Sequence[str]) -> None:
        self._released -= set(tags)

    # ---- migration ---------------------------------------------------------------------------

    def pin(self, state: RequestState) -> KVPin:
        handle = f"kv-{next(self._handles)}"
        token_ids = tuple(state.tokens[: state.num_computed])
        self._pins[handle] = _Pin(rid=state.rid, token_ids=token_ids)
        return KVPin(handle=handle, rid=state.rid, num_tokens=len(token_ids), weight_version=self._version)

    def export_kv(self, handle: str) -> bytes:
        pin = self._pins.get(handle)
        if pin is None:
            raise OutputSourceError(f"no KV pin {handle!r} (already released?)", 404)
        empty = torch.zeros(0)
        return encode_kv(KVPayload(pin.token_ids, self._version, FINGERPRINT, empty, empty))

    def import_kv(self, payload: bytes) -> int:
        kv = decode_kv(payload)
        if kv.fingerprint != FINGERPRINT:
            raise OutputSourceError("KV payload comes from a model engine; this engine is scripted", 409)
        if kv.weight_version != self._version:
            raise OutputSourceError(
                f"KV payload was computed under weight version {kv.weight_version!r}, this engine serves "
                f"{self._version!r}",
                409,
            )
        if kv.token_ids:
            self._imported.add(kv.token_ids)
        return kv.num_tokens

    def unpin(self, handle: str) -> None:
        if self._pins.pop(handle, None) is None:
            raise OutputSourceError(f"no KV pin {handle!r} (already released?)", 404)

    def stats(self) -> dict[str, Any]:
        return {**self.script_status(), "kv_pins": len(self._pins), "released": sorted(self._released)}
