"""The TITO path of one harness request, independent of the API it came in through.

    call = await core.begin(state, request, request_id, clock)  # classify, restore, match, encode
    result = await call.complete()                              # or: async for events in call.stream()

`begin` runs the tree's `prepare` (profile classification, tool-call restoration, matching, and
encoding of only the new messages); nothing is stored yet, so a refused call leaves no trace.
The generation goes to the execution's engine with the exact prompt ids and `return_logprob`;
`complete`/`stream` then commit the output node (exact ids, behaviour log-probs, metadata) and
write it to Redis before they return the last piece, so the API layer answers — or sends the
final SSE event — only after the record is safe. A streamed output is checked against the
recorded parse; a difference is a bug and is counted (`gyre_proxy_stream_mismatches`).
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from gyre.log import get_logger
from gyre.trajectory import (
    AssistantOutput,
    CallMeta,
    ChatTemplate,
    ModelRequest,
    Node,
    PreparedCall,
    RequestError,
    TreeClosedError,
)
from services.proxy.encoding import SegmentEncoder
from services.proxy.errors import (
    EngineOutputError,
    EngineUnavailableError,
    ExecutionClosedError,
    InvalidRequestError,
)
from services.proxy.executions import Executions, ExecutionState
from services.proxy.generation import Generation
from services.proxy.metrics import OverheadClock, ProxyMetrics
from services.proxy.replay import ReplayedGeneration, unanswered_output
from services.proxy.routing import Router
from services.proxy.streaming import Detokenizer, StreamEvent, fold_events, make_streamer

log = get_logger("gyre.proxy.calls")


@dataclass(slots=True)
class CallResult:
    output: AssistantOutput
    output_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    stop_sequence: str | None
    """The stop string that ended the output, if one did."""
    node: Node
    """The recorded output node."""

    @property
    def finish_reason(self) -> str:
        """`tool_calls`, `stop` or `length` (OpenAI's names)."""
        return (
            "stop"
            if self.stop_sequence is not None and not self.output.tool_calls
            else self.output.finish_reason
        )


@dataclass(frozen=True, slots=True)
class CallSettings:
    """The proxy's knobs a call needs (from `ProxySection`)."""

    default_max_tokens: int
    max_engine_attempts: int
    retry_backoff_s: float
    unreachable_wait_s: float = 0.0
    """How long a call waits for an engine while none can be reached (ProxySection.unreachable_wait_s)."""
    replay_unanswered_calls: bool = True
    """Answer a retried call from the output already recorded for it (services/proxy/replay.py)."""
    record_routed_experts: bool = False
    """Ask the engines for each token's MoE experts and record them in the tree (routing replay)."""


class ModelCall:
    def __init__(
        self,
        *,
        state: ExecutionState,
        prepared: PreparedCall,
        generation: Generation | ReplayedGeneration,
        template: ChatTemplate,
        executions: Executions,
        metrics: ProxyMetrics,
        request_id: str,
        clock: OverheadClock,
    ) -> None:
        self.state = state
        self.prepared = prepared
        self.generation = generation
        self.template = template
        self.executions = executions
        self.metrics = metrics
        self.request_id = request_id
        self.clock = clock
        self.received_at_s = time.time()
        self.received_mono = time.monotonic()
        self.result: CallResult | None = None
        self.options: dict[str, Any] = {}
        """API-specific request options (e.g. Chat's `stream_options.include_usage`)."""

    @property
    def request(self) -> ModelRequest:
        return self.prepared.request

    @property
    def prompt_tokens(self) -> int:
        return len(self.generation.prompt_ids)

    @property
    def moved(self) -> bool:
        return self.generation.num_moves > 0

    async def complete(self) -> CallResult:
        self.state.calls.add(self.generation)
        try:
            async for _ in self.generation.run():
                pass
        finally:
            self.state.calls.discard(self.generation)
        return await self._record()

    async def stream(self) -> AsyncGenerator[list[StreamEvent], None]:
        """Events as ids arrive (possibly empty lists: one per engine chunk); the last list comes
        after the output is recorded, and `self.result` is then set."""
        streamer = make_streamer(self.template, self.prepared.id_seed, self.prepared.id_prefix)
        text = Detokenizer(self.template)
        emitted: list[StreamEvent] = []
        self.state.calls.add(self.generation)
        try:
            async for ids in self.generation.run():
                events = streamer.feed(_decoded(text, ids))
                emitted += events
                yield events
        finally:
            self.state.calls.discard(self.generation)
        ids = self.generation.output_ids
        stopped = bool(ids) and ids[-1] in self.template.stop_token_ids
        tail = streamer.feed(text.finish()) + streamer.finish(stopped)
        emitted += tail
        result = await self._record()
        if fold_events(emitted, result.output.stopped) != result.output:
            self.metrics.stream_mismatches.inc()
            log.error("stream_mismatch", request=self.request_id, streamed=repr(emitted)[:2000])
        yield tail

    async def _record(self) -> CallResult:
        gen = self.generation
        if not gen.output_ids:
            raise EngineUnavailableError("the engine returned no output tokens")
        now = time.time()
        first = gen.first_token_at - self.received_mono if gen.first_token_at is not None else 0.0
        meta = CallMeta(
            request_id=self.request_id,
            policy_version=self._policy_version(),
            engine_id=gen.engine_ids[-1] if gen.engine_ids else "",
            started_at_s=self.received_at_s,
            first_token_s=first,
            finished_at_s=now,
        )
        try:
            committed = self.state.tree.commit(
                self.prepared, gen.output_ids, gen.logprobs, meta, routed_experts=gen.routed_experts
            )
        except TreeClosedError as e:
            raise ExecutionClosedError(str(e)) from e
        except ValueError as e:  # the template could not decode the output ids
            raise EngineOutputError(f"the engine output cannot be decoded: {e}") from e
        sampled = 0 if committed.deduplicated else len(gen.output_ids)
        await self.executions.persist(self.state, committed.new_nodes + committed.changed_nodes, sampled)
        assert committed.output is not None
        self.metrics.recorded_call(str(self.prepared.request_kind), self.prepared.history_mismatch)
        self.metrics.tokens_in.inc(self.prompt_tokens)
        self.metrics.tokens_encoded.inc(self.prepared.num_new_tokens)
        self.metrics.tokens_out.inc(len(gen.output_ids))
        log.debug(
            "call_recorded",
            prompt_tokens=self.prompt_tokens,
            new_tokens=self.prepared.num_new_tokens,
            output_tokens=len(gen.output_ids),
            engines=gen.engine_ids,
            moves=gen.num_moves,
            node=committed.output_node.node_id,
        )
        finish = gen.finish
        stop_sequence = finish.matched if finish is not None and isinstance(finish.matched, str) else None
        self.result = CallResult(
            output=committed.output,
            output_ids=list(gen.output_ids),
            prompt_tokens=self.prompt_tokens,
            cached_tokens=gen.cached_tokens,
            stop_sequence=stop_sequence,
            node=committed.output_node,
        )
        return self.result

    def _policy_version(self) -> int:
        versions = [int(v) for v in self.generation.weight_versions if v.isdigit()]
        return min(versions) if versions else self.state.policy_version


def _decoded(text: Detokenizer, ids: list[int]) -> str:
    try:
        return text.feed(ids)
    except ValueError as e:
        raise EngineOutputError(f"the engine output cannot be decoded: {e}") from e


async def prepare(state: ExecutionState, request: ModelRequest, encoder: SegmentEncoder) -> PreparedCall:
    """The tree's `prepare` of a request (nothing stored), encoded by `encoder`; failures as proxy errors."""
    try:
        matched = state.tree.match(request)
    except TreeClosedError as e:
        raise ExecutionClosedError(str(e)) from e
    except RequestError as e:
        raise InvalidRequestError(str(e), e.field) from e
    except ValueError as e:  # a template that cannot render this request (TemplateError)
        raise InvalidRequestError(str(e)) from e
    return matched.encoded(await encoder.encode(matched.texts))


async def begin_call(
    *,
    state: ExecutionState,
    request: ModelRequest,
    router: Router,
    template: ChatTemplate,
    encoder: SegmentEncoder,
    executions: Executions,
    metrics: ProxyMetrics,
    settings: CallSettings,
    request_id: str,
    clock: OverheadClock,
) -> ModelCall:
    """Prepare one call: validate sampling, match and encode against the execution's tree."""
    sampling, max_new_tokens = engine_sampling(request, template, settings.default_max_tokens)
    prepared = await prepare(state, request, encoder)
    recorded = unanswered_output(prepared) if settings.replay_unanswered_calls else None
    generation: Generation | ReplayedGeneration
    if recorded is not None:  # a retry of a call whose answer never reached the harness
        metrics.replayed.inc()
        log.info("call_replayed", execution=state.execution_id, node=recorded.node_id)
        generation = ReplayedGeneration(recorded, prepared.input_ids, template.stop_token_ids)
    else:
        generation = Generation(
            router,
            execution_id=state.execution_id,
            call_id=f"{state.execution_id}-{request_id}",
            prompt_ids=prepared.input_ids,
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            stop_token_ids=template.stop_token_ids,
            stream=request.stream,
            clock=clock,
            max_attempts=settings.max_engine_attempts,
            backoff_s=settings.retry_backoff_s,
            unreachable_wait_s=settings.unreachable_wait_s,
            return_routed_experts=settings.record_routed_experts,
        )
    return ModelCall(
        state=state,
        prepared=prepared,
        generation=generation,
        template=template,
        executions=executions,
        metrics=metrics,
        request_id=request_id,
        clock=clock,
    )


def engine_sampling(
    request: ModelRequest, template: ChatTemplate, default_max_tokens: int
) -> tuple[dict[str, Any], int]:
    """SGLang `sampling_params` (without `max_new_tokens`) and the output budget of a request."""
    s = request.sampling
    params: dict[str, Any] = {"stop_token_ids": sorted(template.stop_token_ids)}
    if s.max_tokens is not None and s.max_tokens < 1:
        raise InvalidRequestError(f"max_tokens must be at least 1; got {s.max_tokens}", "max_tokens")
    if s.temperature is not None:
        if not math.isfinite(s.temperature) or s.temperature < 0:
            raise InvalidRequestError(
                f"temperature must be a non-negative number; got {s.temperature}", "temperature"
            )
        params["temperature"] = s.temperature
    if s.top_p is not None:
        if not 0 < s.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1]; got {s.top_p}", "top_p")
        params["top_p"] = s.top_p
    if s.top_k:
        params["top_k"] = s.top_k
    if s.stop:
        if any(not stop for stop in s.stop):
            raise InvalidRequestError("stop sequences must be non-empty strings", "stop")
        params["stop"] = list(s.stop)
        params["no_stop_trim"] = True  # the recorded ids include the stop string, so the text must too
    return params, s.max_tokens if s.max_tokens is not None else default_max_tokens
