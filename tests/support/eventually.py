"""Waiting in tests: poll a condition until it holds, with a deadline, never a fixed sleep.

    await eventually(lambda: path.exists(), what="the report file")
    stats = await eventually(engine_busy, timeout_s=30)            # async checks too; returns the value
    eventually_sync(lambda: not alive(pid), what="the runner to exit")

A check returns a truthy value when the condition holds (that value is returned) and anything falsy
otherwise; it may be a coroutine function. Past `timeout_s` the wait fails with an AssertionError naming
`what`. On a loaded machine a step takes what it takes: the deadline is generous and the interval small,
so a test waits as long as it must and no longer.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

INTERVAL_S = 0.01


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float = 30.0,
    interval_s: float = INTERVAL_S,
    what: str = "the condition",
) -> T:
    """The first truthy value `check` returns, polled every `interval_s`; AssertionError after `timeout_s`."""
    give_up = _deadline(timeout_s, what)
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        give_up()
        await asyncio.sleep(interval_s)


def eventually_sync(
    check: Callable[[], T],
    *,
    timeout_s: float = 30.0,
    interval_s: float = INTERVAL_S,
    what: str = "the condition",
) -> T:
    """`eventually` for code without an event loop (subprocesses, threads)."""
    give_up = _deadline(timeout_s, what)
    while True:
        value = check()
        if value:
            return value
        give_up()
        time.sleep(interval_s)


def _deadline(timeout_s: float, what: str) -> Callable[[], None]:
    """A function that raises once `timeout_s` has passed since now."""
    deadline = time.monotonic() + timeout_s

    def give_up() -> None:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")

    return give_up
