"""Operations that outlive the RPC that asked for them: a role switch, a step, a publication.

    ops = Detached()
    outcome = await ops.run(("join", batch_id), lambda: agent.step(batch_id, ...))

gRPC cancels a handler when its client goes away, and the scheduler is a client that can be killed at
any moment. Cancelling a cell half-way through a role switch or a step would leave it half-switched, or
leave its gradients in a step it no longer takes part in. So each of these runs as a task of the cell
agent, the RPC only waits for it (shielded), and the same request sent again — by a scheduler that
restarted and re-drives what it had in flight — waits for the same task instead of starting another. A finished operation is forgotten: the next
request starts anew (and is answered from the state it left: a switch to the role the cell is in returns
at once, a step that is done answers `participated: false`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from gyre.log import get_logger

log = get_logger("gyre.cell_agent.detached")
T = TypeVar("T")


class Detached:
    def __init__(self) -> None:
        self._tasks: dict[Hashable, asyncio.Future[Any]] = {}

    async def run(self, key: Hashable, start: Callable[[], Awaitable[T]]) -> T:
        """Wait for the operation `key` in flight, or start it."""
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.ensure_future(start())
            self._tasks[key] = task
            task.add_done_callback(lambda t: self._finished(key, t))
        return await asyncio.shield(task)

    def _finished(self, key: Hashable, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.info("operation_failed", operation=str(key), error=repr(task.exception())[:300])
        if self._tasks.get(key) is task:
            del self._tasks[key]

    async def wait_for(self, kind: str, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the operations whose key starts with `kind` to end; False if one
        is still running then."""
        running = [t for k, t in self._tasks.items() if isinstance(k, tuple) and k and k[0] == kind]
        if not running:
            return True
        _, pending = await asyncio.wait(running, timeout=timeout_s)
        return not pending

    def cancel_all(self) -> None:
        for task in self._tasks.values():
            task.cancel()
