"""The driver: feeds the policy one event at a time, in arrival order, and executes its actions.

Every event source (NATS consumers, RPC completions, timers) calls `handle(make_event)`; the driver
stamps the event with its clock (seconds since the run started, monotonic), applies it, and runs
the actions. Actions that answer at once (a dispatch) return follow-up events that are applied
before the next queued event; long ones (a role transition, a batch) run as tasks that report back
through `handle`. An event the policy rejects (a duplicate delivery, say) is logged and dropped:
the policy validates, the shell does not second-guess it.

After each applied event the driver calls `after_apply` (the service persists its state there, then
starts the long actions): a bus event is handed over with its stream sequence, and `applied_seq` says
which bus events the persisted state includes.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from gyre.log import get_logger
from services.scheduler.policy import Action, Event, Policy

log = get_logger("gyre.scheduler.driver")

MakeEvent = Callable[[float], Event | None]
Execute = Callable[[Action], Awaitable[list[MakeEvent]]]
AfterApply = Callable[[], Awaitable[None]]


class Driver:
    def __init__(
        self,
        policy: Policy,
        execute: Execute,
        after_apply: AfterApply,
        start_s: float = 0.0,
        applied_seq: int = 0,
    ) -> None:
        self.policy = policy
        self._execute = execute
        self._after_apply = after_apply
        self._queue: asyncio.Queue[tuple[list[MakeEvent], int | None, asyncio.Future[None] | None]] = (
            asyncio.Queue()
        )
        self._origin = time.monotonic() - start_s
        self.num_applied = 0
        self.num_rejected = 0
        self.applied_seq = applied_seq
        """Stream sequence of the last bus event applied (0: none yet)."""

    def now(self) -> float:
        return time.monotonic() - self._origin

    async def handle(self, make: MakeEvent | Sequence[MakeEvent], seq: int | None = None) -> None:
        """Queue events and wait until they are applied and persisted (so a NATS ack follows the state
        change). `seq`: the stream sequence of the bus message they came from."""
        makes = [make] if callable(make) else list(make)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put((makes, seq, done))
        await done

    def post(self, make: MakeEvent) -> None:
        """Queue an event without waiting (timers)."""
        self._queue.put_nowait(([make], None, None))

    async def run(self) -> None:
        while True:
            makes, seq, done = await self._queue.get()
            try:
                await self._apply(makes, seq)
            except Exception as e:
                if done is not None:
                    done.set_exception(e)
                raise
            if done is not None and not done.done():
                done.set_result(None)

    async def _apply(self, makes: list[MakeEvent], seq: int | None) -> None:
        pending: deque[MakeEvent] = deque(makes)
        changed = False
        if seq is not None and seq > self.applied_seq:
            self.applied_seq = seq
            changed = True
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
