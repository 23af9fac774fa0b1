"""One model call on the rollout engines: generate, and continue elsewhere when the engine leaves.

    generation = Generation(router, execution_id=..., call_id=..., prompt_ids=ids, ...)   # ids: an array
    async for new_ids in generation.run():      # ids as the engines produce them
        ...
    generation.output_ids, generation.logprobs, generation.finish   # one output, whatever moved
    generation.routed_experts       # with return_routed_experts: MoE experts per forwarded token

An attempt sends `prompt + output so far` to the execution's current engine with the output
budget that is left, so an attempt that ends early (a drain aborted it, the engine aborted or
failed) is continued by the next one and the caller sees one unbroken sequence of ids: nothing
is repeated, nothing is lost. A drain (`Router.drain`) marks the call as moving before it aborts
it; the call then waits until the KV has been migrated and continues on the destination, which
does not count against `max_attempts`. Other failures are retried with exponential backoff on
the execution's route at that moment; an engine that cannot be reached (killed, restarting) first
moves the execution to another serving engine (`Router.fail_over`), so a dead satellite costs its
calls one attempt, not all of them; when no other engine serves, the call waits for one (a restarted
engine) up to `unreachable_wait_s` before its attempts count. An engine's refusal of the request itself (HTTP 400) is
the harness's error and is not retried.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gyre.engine import EngineError, EngineRequestError, EngineUnavailable
from gyre.engine.adapters import adapter_version
from gyre.engine.types import FinishReason
from gyre.log import get_logger
from services.proxy.errors import (
    EngineRefusedError,
    EngineUnavailableError,
    ExecutionClosedError,
    PromptTooLongError,
)
from services.proxy.metrics import OverheadClock
from services.proxy.routing import Engine, Router

log = get_logger("gyre.proxy.generation")


@dataclass(frozen=True, slots=True)
class Finish:
    """How the output ended: `stop` (a stop token or string) or `length`."""

    type: str
    matched: int | str | None = None


class Generation:
    def __init__(
        self,
        router: Router,
        *,
        execution_id: str,
        call_id: str,
        prompt_ids: npt.NDArray[np.int32],
        sampling: Mapping[str, Any],
        max_new_tokens: int,
        stop_token_ids: frozenset[int],
        stream: bool,
        clock: OverheadClock,
        max_attempts: int,
        backoff_s: float,
        unreachable_wait_s: float = 0.0,
        return_routed_experts: bool = False,
    ) -> None:
        self.router = router
        self.execution_id = execution_id
        self.call_id = call_id
        self.prompt_ids = prompt_ids
        """Kept as the array the tree built: it goes to the engine's JSON as is (no list of Python ints)."""
        self.sampling = dict(sampling)
        self.requested_max_new_tokens = max_new_tokens
        self.stop_token_ids = stop_token_ids
        self.stream = stream
        self.clock = clock
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.unreachable_wait_s = unreachable_wait_s
        self.return_routed_experts = return_routed_experts
        self.routed_experts: npt.NDArray[np.int32] | None = None
        """[≤ prompt + output - 1, L·k] the experts of each token an attempt forwarded: the rows of the
        first attempt that forwarded a token (its later outputs were sampled after that routing)."""
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish: Finish | None = None
        self.engine_ids: list[str] = []
        """Every engine that produced part of the output, in order."""
        self.weight_versions: list[str] = []
        self.cached_tokens = 0
        self.first_token_at: float | None = None
        self.num_moves = 0
        self.kv_migrated_tokens = 0
        self.cancelled = False
        self.engine: Engine | None = None
        """Engine of the attempt in flight (None between attempts)."""
        self.rid: str | None = None
        self._attempt_done = asyncio.Event()
        self._move: asyncio.Event | None = None
        self._max_new_tokens: int | None = None

    # -- what the router's drain uses ------------------------------------------------------------

    def begin_move(self) -> None:
        """A drain is about to abort this call's attempt; the call will wait for `end_move`."""
        if self._move is None:
            self._move = asyncio.Event()

    def end_move(self, kv_migrated_tokens: int) -> None:
        self.kv_migrated_tokens += kv_migrated_tokens
        if self._move is not None:
            self._move.set()

    async def wait_attempt_done(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._attempt_done.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    @property
    def attempt_in_flight(self) -> bool:
        return not self._attempt_done.is_set()

    def cancel(self) -> None:
        """The execution closed: stop at the end of the current attempt (the caller aborts it)."""
        self.cancelled = True

    # -- the generation loop ---------------------------------------------------------------------

    async def run(self) -> AsyncIterator[list[int]]:
        failures = 0
        attempt = 0
        waits = 0
        unreachable_since: float | None = None
        last_error: EngineError | None = None
        while True:
            if self.cancelled:
                raise ExecutionClosedError("the execution was closed during the call")
            engine = self.router.acquire(self)
            if self._max_new_tokens is None:
                try:
                    self._max_new_tokens = await self._budget(engine)
                except BaseException:  # refused (prompt too long) or cancelled: the engine holds nothing
                    self.router.release(self, engine)
                    raise
            remaining = self._max_new_tokens - len(self.output_ids)
            if self.output_ids and self.output_ids[-1] in self.stop_token_ids:
                self.router.release(self, engine)
                self.finish = Finish("stop", self.output_ids[-1])
                return
            if remaining <= 0:
                self.router.release(self, engine)
                self.finish = Finish("length")
                return
            self.rid = f"{self.call_id}-{attempt}"
            attempt += 1
            self._attempt_done.clear()
            outcome: FinishReason | None = None
            error: EngineError | None = None
            try:
                async for new_ids, finish in self._attempt(engine, remaining):
                    outcome = finish
                    if new_ids:
                        yield new_ids
            except EngineError as e:
                error = e
            finally:
                self.router.release(self, engine)
                self._attempt_done.set()
            if outcome is not None and not outcome.aborted:
                self.finish = Finish(outcome.type, outcome.matched)
                return
            if self.cancelled:
                raise ExecutionClosedError("the execution was closed during the call")
            if self._move is not None:
                with self.clock.outside():
                    await self._move.wait()
                self._move = None
                self.num_moves += 1
                continue
            if isinstance(error, EngineRequestError):
                raise EngineRefusedError(f"the engine refused the request: {error.message}")
            last_error = error
            if isinstance(error, EngineUnavailable):  # the engine is gone: the next attempt goes elsewhere
                moved_to = self.router.fail_over(self.execution_id, engine.engine_id)
                if moved_to is not None:
                    log.warning(
                        "call_failed_over",
                        execution=self.execution_id,
                        call=self.call_id,
                        engine=engine.engine_id,
                        to=moved_to,
                        error=error.message,
                    )
                else:  # nowhere else to go: wait for an engine (a restarted one) before counting attempts
                    now = time.monotonic()
                    unreachable_since = now if unreachable_since is None else unreachable_since
                    if now - unreachable_since < self.unreachable_wait_s:
                        waits += 1
                        with self.clock.outside():
                            await asyncio.sleep(min(2.0, max(0.05, self.backoff_s * 2 ** min(waits - 1, 8))))
                        continue
            failures += 1
            if failures >= self.max_attempts:
                reason = last_error.message if last_error is not None else "the engine aborted the call"
                raise EngineUnavailableError(
                    f"no engine completed the call after {failures} attempts: {reason}"
                )
            with self.clock.outside():
                await asyncio.sleep(self.backoff_s * 2 ** (failures - 1))

    async def _budget(self, engine: Engine) -> int:
        context_len = await self.router.context_len(engine)
        if context_len is None:
            return self.requested_max_new_tokens
        room = context_len - len(self.prompt_ids)
        if room <= 0:
            raise PromptTooLongError(
                f"prompt is too long: {len(self.prompt_ids)} tokens > {context_len - 1} maximum", "messages"
            )
        return min(self.requested_max_new_tokens, room)

    async def _attempt(
        self, engine: Engine, remaining: int
    ) -> AsyncIterator[tuple[list[int], FinishReason | None]]:
        """One request to one engine: (new ids, finish reason when it ended)."""
        input_ids = (
            np.concatenate([self.prompt_ids, np.asarray(self.output_ids, dtype=self.prompt_ids.dtype)])
            if self.output_ids
            else self.prompt_ids
        )
        params = {**self.sampling, "max_new_tokens": remaining}
        self.engine_ids.append(engine.engine_id)
        first = len(self.engine_ids) == 1
        lora = await self.router.adapter_for(engine)
        # With an adapter the policy version is the adapter's (the engine may report a newer one already).
        version = adapter_version(lora) if lora is not None else None
        if not self.stream:
            with self.clock.outside():
                result = await engine.client.generate(
                    input_ids,
                    params,
                    rid=self.rid,
                    lora_path=lora,
                    return_routed_experts=self.return_routed_experts,
                )
            self.router.saw_version(engine, result.weight_version)
            self._accept_routing(result.routed_experts)
            self._accept(result.output_ids, result.output_logprobs, version or result.weight_version)
            if first:
                self.cached_tokens = result.cached_tokens
            yield result.output_ids, result.finish_reason
            return
        chunks = engine.client.generate_stream(
            input_ids, params, rid=self.rid, lora_path=lora, return_routed_experts=self.return_routed_experts
        )
        iterator = chunks.__aiter__()
        try:
            while True:
                with self.clock.outside():
                    try:
                        chunk = await iterator.__anext__()
                    except StopAsyncIteration:
                        return
                reported = chunk.meta_info.get("weight_version")
                self.router.saw_version(engine, reported)
                self._accept(chunk.new_output_ids, chunk.new_logprobs, version or reported)
                if chunk.finished:
                    self._accept_routing(chunk.routed_experts)
                if first and chunk.meta_info.get("cached_tokens") is not None:
                    self.cached_tokens = int(chunk.meta_info["cached_tokens"])
                yield chunk.new_output_ids, chunk.finish_reason
        finally:
            with self.clock.outside():
                await chunks.aclose()  # type: ignore[attr-defined]

    def _accept_routing(self, rows: npt.NDArray[np.int32] | None) -> None:
        """Extend the call's routing with an attempt's rows beyond those an earlier attempt gave."""
        if rows is None:
            return
        forwarded = np.flatnonzero((rows >= 0).any(axis=1))  # an aborted prefill leaves -1 rows at the end
        rows = rows[: int(forwarded[-1]) + 1] if len(forwarded) else rows[:0]
        known = self.routed_experts
        if known is None or len(known) == 0:
            self.routed_experts = rows
        elif rows.shape[1] != known.shape[1]:
            raise EngineUnavailableError(
                f"the engine returned routing of width {rows.shape[1]}; an earlier attempt's was {known.shape[1]}"
            )
        elif len(rows) > len(known):
            self.routed_experts = np.concatenate([known, rows[len(known) :]])

    def _accept(self, ids: list[int], logprobs: list[float], weight_version: Any) -> None:
        if len(logprobs) != len(ids):
            raise EngineUnavailableError(
                f"the engine returned {len(logprobs)} log-probs for {len(ids)} output ids (return_logprob ignored?)"
            )
        if ids and self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.output_ids.extend(ids)
        self.logprobs.extend(logprobs)
        if weight_version is not None and str(weight_version) not in self.weight_versions:
            self.weight_versions.append(str(weight_version))
