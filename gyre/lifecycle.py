"""Service lifecycle helpers: a supervisor for background tasks and signal handling.

Background tasks are supervised: the first crash is raised from `wait()` (never swallowed), and
`stop()` cancels the rest within a time cap. Signal handlers only set an event. `hold_grpc_aio` keeps
gRPC AsyncIO's poller alive for the life of a process (why: its docstring).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine, Sequence
from typing import Any

import grpc.aio

from gyre.log import get_logger

log = get_logger("gyre.lifecycle")


class TaskSupervisor:
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


_grpc_aio_held = False


def hold_grpc_aio() -> None:
    """Start gRPC AsyncIO's process-wide completion-queue poller once and never shut it down.

    grpc.aio starts its poller thread with the first aio object (server, channel) and shuts it down when
    the last one is freed, joining the thread. That join can hang forever (grpc 1.85; grpc/grpc#40989):
    the poller wakes event loops by writing one byte per event to a socket pair that only a *running*
    bound loop reads, so events that arrive after the loops stopped fill the socket's buffer, the poller
    blocks in `write`, and never sees the shutdown. A process that opens and frees channels from loop
    after loop meets it: the supervisor's health checks, and a pytest session with a loop per test (CI
    once hung 300 s in the last test's teardown there). Holding one reference from the start keeps the
    poller up until the process exits, where grpc skips the shutdown. Call it at a process's start,
    from the main thread, inside its event loop or before it has one (a loop of its own then lends grpc
    one to bind: uvloop's policy has no default loop); a second call does nothing."""
    global _grpc_aio_held
    if _grpc_aio_held:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(_init_grpc_aio())
        finally:
            loop.close()
    else:
        grpc.aio.init_grpc_aio()
    _grpc_aio_held = True


async def _init_grpc_aio() -> None:
    grpc.aio.init_grpc_aio()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install_signal_handlers(stop: asyncio.Event, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
    """Each of `signals` (SIGTERM and SIGINT) sets `stop`; nothing else happens inside a handler."""
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
