"""The driver: feeds the policy one event at a time, in arrival order, and executes its actions.

Every event source (NATS consumers, RPC completions, timers) calls `handle(make_event)`; the driver
stamps the event with its clock (seconds since the run started, monotonic), applies it, and runs
the actions. Actions that answer at once (a dispatch) return follow-up events that are applied
before the next queued event; long ones (a role transition, a batch) run as tasks that report back
through `handle`. An event the policy rejects (a duplicate delivery, say) is logged and dropped:
the policy validates, the shell does not second-guess it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

from gyre.log import get_logger
from services.scheduler.policy import Action, Event, Policy

log = get_logger("gyre.scheduler.driver")

MakeEvent = Callable[[float], Event | None]
Execute = Callable[[Action], Awaitable[list[MakeEvent]]]
AfterApply = Callable[[], Awaitable[None]]


class Driver:
    def __init__(self, policy: Policy, execute: Execute, after_apply: AfterApply, start_s: float = 0.0) -> None:
        self.policy = policy
        self._execute = execute
        self._after_apply = after_apply
        self._queue: asyncio.Queue[tuple[MakeEvent, asyncio.Future[None] | None]] = asyncio.Queue()
        self._origin = time.monotonic() - start_s
        self.num_applied = 0
        self.num_rejected = 0

    def now(self) -> float:
        return time.monotonic() - self._origin

    async def handle(self, make: MakeEvent) -> None:
        """Queue an event and wait until it is applied (so a NATS ack follows the state change)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put((make, done))
        await done

    def post(self, make: MakeEvent) -> None:
        """Queue an event without waiting (timers)."""
        self._queue.put_nowait((make, None))

    async def run(self) -> None:
        while True:
            make, done = await self._queue.get()
            try:
                await self._apply(make)
            except Exception as e:
                if done is not None:
                    done.set_exception(e)
                raise
            if done is not None and not done.done():
                done.set_result(None)

    async def _apply(self, make: MakeEvent) -> None:
        pending: deque[MakeEvent] = deque([make])
        changed = False
        while pending:
            event = pending.popleft()(self.now())
            if event is None:
                continue
            try:
                actions = self.policy.handle(event)
            except ValueError as e:
                self.num_rejected += 1
                log.warning("policy_rejected_event", kind=type(event).__name__, error=str(e))
                continue
            self.num_applied += 1
            changed = True
            for action in actions:
                pending.extend(await self._execute(action))
        if changed:
            await self._after_apply()
