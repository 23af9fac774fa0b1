"""EngineCore: the continuous-batching loop of the embedded engine.

One asyncio task owns every request and alternates two phases:

    schedule   (event loop)     apply queued commands; admit waiting requests while the batch has
                                room and the source has KV; plan one step over all running requests
    execute    (compute thread) the output source runs the step and samples (torch releases the GIL, so
                                HTTP stays responsive); a decode step shorter than `inline_step_ms`
                                runs on the event loop instead (no thread hand-offs)
    process    (event loop)     append tokens, apply SGLang's stop rules, notify streams (a plain
                                request only when it finishes), free finished requests

Control operations (abort, pause, weight updates, memory release, KV pins) are queued and applied
between steps, so nothing a running step reads ever changes under it.

Pause modes follow SGLang: `abort` aborts everything in flight, `in_place` freezes running requests
with their KV, `retract` returns them to the waiting queue (their KV goes to the prefix cache and is
recomputed where evicted). While paused, new requests queue and are admitted after
`continue_generation`. When no running request can get a KV block, the most recently admitted one is
retracted the same way.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog

from gyre.engine.types import FinishReason
from gyre.model.tokenizer import Tokenizer
from services.cell_agent.engine.protocol import GenerateRequest, RequestRefused
from services.cell_agent.engine.request import Phase, RequestState
from services.cell_agent.engine.sampler import request_generator
from services.cell_agent.engine.sources.base import (
    MEMORY_TAGS,
    KVPin,
    OutputSource,
    OutputSourceError,
    Sampled,
    StepPlan,
)

log = structlog.get_logger(__name__)

T = TypeVar("T")
PAUSE_MODES = ("abort", "in_place", "retract")


class EngineCore:
    def __init__(
        self,
        source: OutputSource,
        *,
        tokenizer: Tokenizer,
        eos_token_ids: frozenset[int],
        max_batch_size: int,
        seed: int,
        inline_step_ms: float = 0.0,
    ) -> None:
        self.source = source
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_batch_size = max_batch_size
        self.seed = seed
        self.paused: str | None = None
        self.failed: BaseException | None = None
        self.num_steps = 0
        self.num_retractions = 0
        self.num_finished = 0
        """Requests finished (any reason), and the token totals below over them (for `/metrics`)."""
        self.num_prompt_tokens = 0
        self.num_cached_prompt_tokens = 0
        """Prompt tokens whose KV came from the prefix cache (or imported KV) instead of a prefill."""
        self.num_output_tokens = 0
        self.inline_step_ms = inline_step_ms
        self.decode_step_ms: float | None = None
        """Recent CPU time of a decode step (moving average), which decides where the next one runs."""
        self.num_inline_steps = 0
        self.compute_cpu_s = 0.0
        """CPU seconds spent in the source's `execute` (forward and sampling), wherever it ran."""
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []
        self._by_rid: dict[str, RequestState] = {}
        self._commands: deque[tuple[Callable[[], Any], asyncio.Future[Any]]] = deque()
        self._wake = asyncio.Event()
        self._stopping = False
        self._admit_seq = itertools.count()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-compute")

    # ---- API for the HTTP layer (event loop thread) ------------------------------------------

    def submit(self, request: GenerateRequest, notify: Callable[[], None]) -> RequestState:
        if self.failed is not None:
            raise RequestRefused(f"the engine loop has failed: {self.failed}", 500)
        if self._stopping:
            raise RequestRefused("the engine is shutting down", 503)
        if request.rid in self._by_rid:
            raise RequestRefused(
                f"Duplicate request ID {request.rid!r}: a request with this rid is in flight"
            )
        vocab_size = self.source.vocab_size
        if request.input_ids and max(request.input_ids) >= vocab_size:  # max: C speed, no per-id test
            culprit = next(t for t in request.input_ids if t >= vocab_size)
            raise RequestRefused(f"input_ids must be token ids in [0, {vocab_size}); got {culprit}")
        adapter = None
        if request.lora_name is not None:
            if self.source.adapters is None:
                raise RequestRefused(
                    f"lora_path {request.lora_name!r}: this engine serves no LoRA adapters "
                    f"(--enable-lora; the {self.source.name} output source)"
                )
            adapter = self.source.adapters.acquire(request.lora_name)
        gen = request_generator(self.seed, request.rid, request.sampling.sampling_seed)
        state = RequestState(request=request, generator=gen, notify=notify, adapter=adapter)
        self._by_rid[request.rid] = state
        self._waiting.append(state)
        self._wake.set()
        return state

    async def control(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the loop between two steps and return its result (or raise its error)."""
        if self.failed is not None:
            raise OutputSourceError(f"the engine loop has failed: {self.failed}", 500)
        if self._stopping:
            raise OutputSourceError("the engine is shutting down", 503)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._commands.append((fn, future))
        self._wake.set()
        return await future

    def abort(self, rid: str | None, abort_all: bool = False) -> None:
        """Fire-and-forget, as SGLang's `/abort_request`: applied before the next step."""
        self._commands.append(
            (lambda: self._abort(rid, abort_all, "Aborted by /abort_request."), _detached())
        )
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def stats(self) -> dict[str, Any]:
        return {
            "num_running_reqs": len(self._running),
            "num_waiting_reqs": len(self._waiting),
            "paused": self.paused,
            "num_steps": self.num_steps,
            "num_retractions": self.num_retractions,
            "num_inline_steps": self.num_inline_steps,
            "compute_cpu_s": round(self.compute_cpu_s, 6),
            "weight_version": self.source.weight_version,
            "ready": self.source.ready,
            **self.source.stats(),
        }

    # ---- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                self._apply_commands()
                if self._stopping:
                    break
                plan = self._schedule()
                if plan is None:
                    if not self._commands and not self._stopping:
                        self._wake.clear()
                        await self._wake.wait()
                    continue
                sampled = await self._execute(plan)
                self.source.commit(plan)
                self._process(sampled)
                self.num_steps += 1
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.failed = e
            self._fail_everything(e)
            raise
        finally:
            self._executor.shutdown(wait=True, cancel_futures=True)
            for state in list(self._by_rid.values()):
                if not state.finished:
                    self._finish(state, FinishReason.abort("the engine is shutting down", 503))

    async def _execute(self, plan: StepPlan) -> list[Sampled]:
        """Run a step on the compute thread, or on the loop itself when the source marks it a decode step
        (every row one token, nothing else to compute) and recent decode steps took less CPU time than
        `inline_step_ms`: then the two thread hand-offs of a step cost more than the step, and most of
        all on a busy machine, where each hand-off waits for a core (`gyre bench engine`)."""
        decode = plan.decode
        if decode and self.decode_step_ms is not None and self.decode_step_ms < self.inline_step_ms:
            sampled, cpu_s = _timed_execute(self.source, plan)
            self.num_inline_steps += 1
            await asyncio.sleep(0)  # HTTP handlers run between two steps
        else:
            loop = asyncio.get_running_loop()
            sampled, cpu_s = await loop.run_in_executor(self._executor, _timed_execute, self.source, plan)
        self.compute_cpu_s += cpu_s
        if decode:
            ms = cpu_s * 1000
            self.decode_step_ms = ms if self.decode_step_ms is None else 0.8 * self.decode_step_ms + 0.2 * ms
        return sampled

    def _fail_everything(self, error: BaseException) -> None:
        log.error(
            "engine_loop_failed", error=repr(error), running=len(self._running), waiting=len(self._waiting)
        )
        for state in list(self._by_rid.values()):
            if not state.finished:
                self._finish(state, FinishReason.abort(f"engine failure: {error!r}", 500), release=False)
        while self._commands:
            _, future = self._commands.popleft()
            if not future.done():
                future.set_exception(OutputSourceError(f"the engine loop has failed: {error!r}", 500))

    def _apply_commands(self) -> None:
        while self._commands:
            fn, future = self._commands.popleft()
            try:
                result = fn()
            except Exception as e:  # the operation failed, not the loop: its caller gets the error
                if not future.done():
                    future.set_exception(e)
                continue
            if not future.done():
                future.set_result(result)

    def _schedule(self) -> Any:
        if self.paused is not None or not self.source.ready:
            return None
        self._admit()
        while self._running:
            plan = self.source.prepare(self._running)
            if plan.rows:
                return plan
            if not plan.starved:
                return None
            # No running request can get a KV block: give up the most recently admitted one.
            victim = max(self._running, key=lambda s: s.admit_seq)
            if len(self._running) == 1:
                self._finish(victim, FinishReason.abort("the KV cache cannot hold this request", 507))
            else:
                self._retract(victim)
        return None

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_batch_size:
            state = self._waiting[0]
            if state.request.sampling.max_new_tokens == 0:
                self._finish(state, FinishReason.max_length(0))
                continue
            try:
                admitted = self.source.admit(state)
            except (RequestRefused, OutputSourceError) as e:
                self._waiting.popleft()
                del self._by_rid[state.rid]
                state.fail(e)
                self._release_adapter(state)
                continue
            if not admitted:
                return
            self._waiting.popleft()
            state.phase = Phase.RUNNING
            state.admit_seq = next(self._admit_seq)
            self._running.append(state)

    def _process(self, sampled: Sequence[Sampled]) -> None:
        for item in sampled:
            state = item.state
            state.append(item.token_id, item.logprob)
            reason = self._check_finish(state) or item.finish
            if reason is not None:
                self._finish(state, reason)
            elif state.request.stream:
                state.notify()  # a plain request waits for its finish only: no wake-up per token

    def _check_finish(self, state: RequestState) -> FinishReason | None:
        """SGLang's order: length, then stop token (unless ignore_eos), then stop string."""
        params = state.request.sampling
        assert params.max_new_tokens is not None
        if state.num_output >= params.max_new_tokens:
            return FinishReason.max_length(params.max_new_tokens)
        last = state.tokens[-1]
        if not params.ignore_eos and (last in params.stop_token_ids or last in self.eos_token_ids):
            return FinishReason.stop(last)
        if params.stop:
            window = max(len(s.encode()) for s in params.stop) + 3
            tail = self.tokenizer.decode(state.output_ids[-window:])
            for stop in params.stop:
                if stop in tail:
                    return FinishReason.stop(stop)
        if len(state.tokens) >= self.source.context_len:
            return FinishReason.max_length(state.num_output)
        return None

    def _finish(self, state: RequestState, reason: FinishReason, release: bool = True) -> None:
        if state.phase is Phase.RUNNING:
            self._running.remove(state)
        elif state.phase is Phase.WAITING and state in self._waiting:
            self._waiting.remove(state)
        self._by_rid.pop(state.rid, None)
        self.num_finished += 1
        self.num_prompt_tokens += state.num_prompt
        self.num_cached_prompt_tokens += max(state.num_cached, 0)
        self.num_output_tokens += state.num_output
        if release and state.request.return_routed_experts:
            state.routed_experts = self.source.routed_experts(state)
        state.set_finished(reason)
        if release:
            self.source.release(state)
        self._release_adapter(state)

    def _release_adapter(self, state: RequestState) -> None:
        if state.adapter is not None and self.source.adapters is not None:
            self.source.adapters.release(state.adapter)

    def _retract(self, state: RequestState) -> None:
        assert state.phase is Phase.RUNNING
        self._running.remove(state)
        self.source.release(state)
        state.phase = Phase.WAITING
        state.num_retractions += 1
        self.num_retractions += 1
        self._waiting.appendleft(state)

    # ---- control operations (run between steps through `control`) ----------------------------

    def _abort(self, rid: str | None, abort_all: bool, message: str) -> int:
        targets = (
            list(self._by_rid.values()) if abort_all else [self._by_rid[rid]] if rid in self._by_rid else []
        )
        for state in targets:
            self._finish(state, FinishReason.abort(message))
        return len(targets)

    def pause(self, mode: str) -> None:
        if mode not in PAUSE_MODES:
            raise RequestRefused(f"Invalid mode: {mode!r}. Expected one of {list(PAUSE_MODES)}.")
        if mode == "abort":
            self._abort(None, True, "Aborted by /pause_generation (mode=abort).")
        elif mode == "retract":
            for state in sorted(self._running, key=lambda s: s.admit_seq, reverse=True):
                self._retract(state)
        self.paused = mode

    def resume(self) -> None:
        self.paused = None

    def flush_cache(self) -> bool:
        """SGLang refuses to flush while requests run; so do we (the cache is safe either way)."""
        if self._running:
            return False
        self.source.flush_cache()
        return True

    def release_memory(self, tags: Sequence[str] | None) -> None:
        tags = _check_tags(tags)
        if self._running:
            raise OutputSourceError(
                f"{len(self._running)} running requests hold KV; pause_generation with mode 'retract' or "
                "'abort' first"
            )
        self.source.release_memory(tags)

    def resume_memory(self, tags: Sequence[str] | None) -> None:
        self.source.resume_memory(_check_tags(tags))

    def update_weights(self, apply: Callable[[], str], flush_cache: bool, abort_all: bool) -> str:
        if abort_all:
            self._abort(None, True, "Aborted by a weight update (abort_all_requests).")
        message = apply()
        if flush_cache:
            self.source.flush_cache()
        return message

    def pin(self, rid: str) -> KVPin:
        state = self._by_rid.get(rid)
        if state is None:
            raise OutputSourceError(f"no request {rid!r} in flight to pin", 404)
        return self.source.pin(state)


def _timed_execute(source: OutputSource, plan: StepPlan) -> tuple[list[Sampled], float]:
    """The step's samples and the CPU seconds its thread spent on it."""
    start = time.thread_time()
    sampled = source.execute(plan)
    return sampled, time.thread_time() - start


def _check_tags(tags: Sequence[str] | None) -> list[str]:
    if tags is None:
        return list(MEMORY_TAGS)
    unknown = [t for t in tags if t not in MEMORY_TAGS]
    if unknown:
        raise RequestRefused(f"unknown memory tags {unknown}; expected a subset of {list(MEMORY_TAGS)}")
    return list(tags)


def _detached() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()
