"""Publishing the supervisor's `ProcessExited` events, in order, whenever NATS takes them.

The supervisor's watch loop must never wait on NATS (NATS itself may be the process that exited), so it
only queues events here; `run()` publishes them in a background task, retrying each one until NATS
acknowledges it (an exit of nats-server is published once it is back). Event ids are deterministic
(`stack.exited:<process>:<pid>`), so a retry never stores an event twice.
"""

from __future__ import annotations

import asyncio
import contextlib

from app.stack.restarts import RestartDecision
from gyre.bus import EventBus
from gyre.config import GyreConfig
from gyre.log import get_logger
from gyre.v1 import events_pb2 as ev

log = get_logger("app.stack.events")


class ExitPublisher:
    """A queue of `ProcessExited` events and the task that publishes them."""

    def __init__(self, config: GyreConfig, retry_s: float = 1.0) -> None:
        self.config = config
        self.retry_s = retry_s
        self.queue: asyncio.Queue[ev.ProcessExited] = asyncio.Queue()
        self.bus: EventBus | None = None

    def add(
        self, process: str, pid: int, exit_code: int, sig: str, reason: str, decision: RestartDecision
    ) -> None:
        event = ev.ProcessExited(
            process=process,
            pid=pid,
            exit_code=exit_code,
            signal=sig,
            reason=reason,
            num_restarts=decision.num_restarts,
            restart_in_s=decision.delay_s,
            gave_up=not decision.restart,
        )
        self.queue.put_nowait(event)

    async def run(self) -> None:
        while True:
            event = await self.queue.get()
            while True:
                try:
                    await self._publish(event)
                    self.queue.task_done()
                    break
                except Exception as e:  # NATS down or restarting: keep the event, try again
                    log.warning("process_exit_not_published", process=event.process, error=repr(e))
                    await asyncio.sleep(self.retry_s)

    async def _publish(self, event: ev.ProcessExited) -> None:
        if self.bus is None:
            nats = self.config.nats
            self.bus = await asyncio.wait_for(
                EventBus.connect(
                    nats.url or "",
                    self.config.run.id,
                    "supervisor",
                    ensure_streams=False,
                    login=nats.login_for("supervisor"),
                ),
                timeout=5.0,
            )
        await self.bus.publish(event, event_id=f"stack.exited:{event.process}:{event.pid}")

    async def close(self, task: asyncio.Task[None], flush_s: float = 1.0) -> None:
        """Give queued events `flush_s` to go out, then stop the task and the connection."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.queue.join(), timeout=flush_s)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self.bus is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.bus.close(), timeout=1.0)
