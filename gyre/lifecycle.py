"""Service lifecycle helpers: a supervisor for background tasks and signal handling.

Background tasks are supervised: the first crash is raised from `wait()` (never swallowed), and
`stop()` cancels the rest within a time cap. Signal handlers only set an event.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any

from gyre.log import get_logger

log = get_logger("gyre.lifecycle")


class Supervisor:
    """Owns a set of background tasks; a task that raises fails the whole set."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=f"{self.name}/{name}")
        self._tasks.add(task)
        task.add_done_callback(self._on_done)
        return task

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self._failed.done():
            log.error("task_crashed", task=task.get_name(), error=repr(exc))
            self._failed.set_exception(exc)

    async def wait(self) -> None:
        """Block until a supervised task crashes; re-raises its exception."""
        await asyncio.shield(self._failed)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Cancel every task and wait for them, at most `timeout_s`. Idempotent."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        if not self._failed.done():
            self._failed.cancel()
        elif not self._failed.cancelled():
            self._failed.exception()  # mark retrieved; it was raised from wait() or logged


def install_signal_handlers(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set `stop`; nothing else happens inside a handler."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
