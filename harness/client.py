"""The demo harness's model client: the official `anthropic` SDK, configured only by
`ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` (exactly how Claude Code is wired), with the
harness's own retries of failed calls.

Every call says who makes it through headers the proxy's `generic` harness profile classifies by:
`x-gyre-agent: sub` on a sub-agent's calls, `x-gyre-request: summary` on compaction requests.
A failed call (connection error, timeout, 408/409/429/5xx, an error event inside a stream, a stream cut
off mid-way: the SDK raises its HTTP transport's error then) is retried with seeded, jittered exponential
backoff; other errors (400, 401, 403, 404…) are not.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message

RETRYABLE_STATUS = frozenset({408, 409, 429})


class ModelCallError(RuntimeError):
    """A model call failed for good (not retryable, or out of retries)."""


@dataclass(slots=True)
class CallStats:
    calls: int = 0
    """Requests sent, retries included."""
    retries: int = 0
    """Requests that repeated a failed one."""
    summaries: int = 0
    """Compaction (summary) requests that succeeded."""
    sub_agent_calls: int = 0
    """Successful calls made by sub-agents."""


def retryable(error: anthropic.APIError | httpx2.TransportError) -> bool:
    if isinstance(error, anthropic.APIStatusError):
        return error.status_code in RETRYABLE_STATUS or error.status_code >= 500
    return True  # connection errors, timeouts, error events inside a stream


class ModelClient:
    """Sends Messages API requests; one instance is shared by the main agent and its sub-agents."""

    def __init__(
        self,
        model: str = "gyre-embedded",
        max_tokens: int = 512,
        stream: bool = True,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        timeout_s: float = 600.0,
        seed: int = 0,
        sdk: anthropic.Anthropic | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_retries < 0 or backoff_s < 0:
            raise ValueError("max_retries and backoff_s must be non-negative")
        # The SDK's own retries are off: retrying is the harness's behaviour under test.
        self.sdk = sdk or anthropic.Anthropic(max_retries=0, timeout=timeout_s)
        self.model = model
        self.max_tokens = max_tokens
        self.stream = stream
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.stats = CallStats()
        self._rng = random.Random(seed)
        self._sleep = sleep

    def create(
        self,
        system: str,
        tools: list[dict[str, Any]],
        messages: list[dict[str, Any]],
        *,
        sub_agent: bool = False,
        summary: bool = False,
        max_tokens: int | None = None,
    ) -> Message:
        headers: dict[str, str] = {}
        if sub_agent:
            headers["x-gyre-agent"] = "sub"
        if summary:
            headers["x-gyre-request"] = "summary"
        request: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens or self.max_tokens,
            "system": system,
            "messages": messages,
            "extra_headers": headers,
        }
        if tools:
            request["tools"] = tools
        for attempt in range(self.max_retries + 1):
            self.stats.calls += 1
            if attempt:
                self.stats.retries += 1
            try:
                response = self._send(request)
            except (anthropic.APIError, httpx2.TransportError) as e:
                if not retryable(e) or attempt == self.max_retries:
                    raise ModelCallError(f"model call failed after {attempt + 1} attempt(s): {e}") from e
                delay = min(self.backoff_s * 2**attempt, 8.0) * (0.5 + self._rng.random())
                print(
                    f"harness: model call failed ({type(e).__name__}); retry in {delay:.2f} s",
                    file=sys.stderr,
                )
                self._sleep(delay)
                continue
            if summary:
                self.stats.summaries += 1
            if sub_agent:
                self.stats.sub_agent_calls += 1
            return response
        raise AssertionError("unreachable: the loop returns or raises")

    def _send(self, request: dict[str, Any]) -> Message:
        if not self.stream:
            message: Message = self.sdk.messages.create(**request)
            return message
        with self.sdk.messages.stream(**request) as stream:
            final: Message = stream.get_final_message()
            return final
