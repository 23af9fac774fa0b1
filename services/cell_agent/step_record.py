"""The join window and reduction handshake of one optimizer step, in Redis next to its micro-step queue.

The packer fills the WorkQueue `microsteps:<batch_id>`; the cells of the step claim from it. This
record decides, atomically, who takes part in the step's gradient reduction:

    open        the core opens the record for step s (the policy version being trained)
    register    a cell that holds the weights of version s joins (only while the record is open)
    mark_done   after a micro-step's backward: only while the cell still owns the item
    try_close   the core: when the stream is closed, nothing is pending, and every claimed item is
                done by a live participant, the window starts closing with those candidates; it
                closes once every candidate confirmed (and reopens if anything moved meanwhile)
    confirm     a candidate, idle at its consistent point: alive and ready to reduce
    finish      the core, after its optimizer step: the result version

Why claims are acknowledged only after the step: a cell's gradient lives in its memory, so if it dies
after finishing some micro-steps, their work is lost with it. Items stay in the cell's processing
list until the reduction is over; a dead cell's list — done or not — goes back to the queue
(`WorkQueue.reclaim_dead`), the others redo it, and the dead cell is left out of the reduction.

Participant rules checked by `try_close` (one Lua script, so one consistent view):
- live: its heartbeat on the queue is fresher than the timeout;
- clean: every item it marked done is still in its processing list (otherwise something was
  reclaimed from it and its gradient includes work others redo: a satellite is evicted, the core —
  which no step can do without — starts its part over with zeroed gradients, `reset`);
- a prefix: the reduction runs over the pre-built group {0..m−1}, so a live cell above a gap (a dead
  cell below it) is evicted too and its items requeued;
- the window closes only when the participants' processing lists hold every outstanding item.

- confirmed: a heartbeat only says a cell was alive a moment ago, so before the window closes every
  candidate confirms; a candidate that died after its last micro-step never confirms, its heartbeat
  lapses, the window reopens, its claims are reclaimed and redone, and it is left out. (A cell that
  dies after confirming fails the collective: the step errors out; see the README.)

An evicted cell finds out at its next `mark_done` or status check, gives its claims back
(`release`) and leaves the step with its gradient discarded.

The keys share the queue's hash tag, so the scripts also see the queue's pending list, processing
lists and heartbeats (their names follow `gyre.store.workqueue`; a unit test pins them).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import redis.asyncio as aioredis

from gyre.store import Keys, WorkQueue
from services.cell_agent import step_scripts as scripts

CONSUMER_PREFIX = "cell-"


class StepState(StrEnum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    DONE = "done"


class Registration(StrEnum):
    REGISTERED = "registered"
    NOT_OPEN = "not_open"
    CLOSED = "closed"
    WRONG_STEP = "wrong_step"
    EVICTED = "evicted"


@dataclass(frozen=True, slots=True)
class StepStatus:
    state: StepState | None
    """None until the core opened the record."""
    step: int | None
    final_in_burst: bool
    cells: tuple[int, ...]
    """The reduction's participants, once closed (a prefix 0..m−1)."""
    version: int | None
    """Policy version after the step, once done."""
    evicted: bool = False
    """The asking cell was evicted from this step."""
    reason: str = ""
    """Why `try_close` did not close (for logs): stream_open, pending, computing, stale, evicted, …"""


def consumer_name(cell: int) -> str:
    return f"{CONSUMER_PREFIX}{cell}"


def _cells(raw: bytes | str | None) -> tuple[int, ...]:
    text = raw.decode() if isinstance(raw, bytes) else (raw or "")
    return tuple(int(c) for c in text.split(",") if c)


def _text(raw: bytes | str | None) -> str | None:
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else raw


class StepRecord:
    """The record of one batch's step; every cell of the step builds one over the same keys."""

    def __init__(
        self, redis: aioredis.Redis, keys: Keys, batch_id: str, *, heartbeat_timeout_s: float
    ) -> None:
        self.batch_id = batch_id
        self.queue = WorkQueue(redis, keys, f"microsteps:{batch_id}", heartbeat_timeout_s=heartbeat_timeout_s)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._redis = redis

        def k(part: str) -> str:
            return keys.queue(self.queue.name, part)

        # The queue's own keys (layout of gyre.store.workqueue).
        self.pending_key, self.known_key, self.acked_key = k("pending"), k("known"), k("acked")
        self.payloads_key, self.heartbeats_key, self.closed_key = k("payloads"), k("heartbeats"), k("closed")
        self.processing_prefix = k("processing:")
        # This record's keys.
        self.join_key, self.participants_key, self.evicted_key = k("join"), k("participants"), k("evicted")
        self.metrics_key, self.done_prefix, self.ready_key = k("metrics"), k("done:"), k("ready")
        self.accumulated_key = k("accumulated")
        self._open = redis.register_script(scripts.OPEN)
        self._status = redis.register_script(scripts.STATUS)
        self._register = redis.register_script(scripts.REGISTER)
        self._mark_done = redis.register_script(scripts.MARK_DONE)
        self._release = redis.register_script(scripts.RELEASE)
        self._reset = redis.register_script(scripts.RESET)
        self._evict_self = redis.register_script(scripts.EVICT_SELF)
        self._ack_all = redis.register_script(scripts.ACK_ALL)
        self._try_close = redis.register_script(scripts.TRY_CLOSE)
        self._confirm = redis.register_script(scripts.CONFIRM)
        self._restart = redis.register_script(scripts.RESTART)
        self._finish_replayed = redis.register_script(scripts.FINISH_REPLAYED)

    def processing_key(self, cell: int) -> str:
        return self.processing_prefix + consumer_name(cell)

    def done_key(self, cell: int) -> str:
        return f"{self.done_prefix}{cell}"

    async def open(self, step: int, final_in_burst: bool) -> StepStatus:
        """Core: open the record for `step` (a no-op if it exists); returns what the record says."""
        await self._open(keys=[self.join_key], args=[step, int(final_in_burst)])
        return await self.status(0)

    async def status(self, cell: int) -> StepStatus:
        state, step, final, cells, version, evicted = await self._status(
            keys=[self.join_key, self.evicted_key], args=[cell]
        )
        state_text = _text(state)
        step_text, version_text = _text(step), _text(version)
        return StepStatus(
            state=StepState(state_text) if state_text else None,
            step=int(step_text) if step_text is not None else None,
            final_in_burst=_text(final) == "1",
            cells=_cells(cells),
            version=int(version_text) if version_text is not None else None,
            evicted=bool(evicted),
        )

    async def wait_opened(self, timeout_s: float, poll_s: float) -> StepStatus:
        """Satellite: wait until the core opened the record (JoinBatch may reach a satellite first)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            status = await self.status(-1)
            if status.state is not None:
                return status
            if loop.time() >= deadline:
                raise TimeoutError(f"batch {self.batch_id!r} was not opened by the core within {timeout_s} s")
            await asyncio.sleep(poll_s)

    async def register(self, cell: int, step: int) -> Registration:
        """Join the step's reduction while the window is open, holding the weights of `step`."""
        raw = await self._register(
            keys=[self.join_key, self.participants_key, self.evicted_key, self.heartbeats_key],
            args=[cell, consumer_name(cell), step],
        )
        return Registration(_text(raw) or Registration.NOT_OPEN.value)

    async def heartbeat(self, cell: int) -> None:
        await self.queue.heartbeat(consumer_name(cell))

    async def mark_done(self, cell: int, item_id: str, metrics_json: str) -> bool:
        """Record a finished micro-step (and the cell's running metrics); False = evicted, or the item
        was reclaimed from this cell: its gradient no longer counts. Finishing an item twice evicts
        the cell (its gradient holds that item twice)."""
        return bool(
            await self._mark_done(
                keys=[
                    self.processing_key(cell),
                    self.done_key(cell),
                    self.evicted_key,
                    self.metrics_key,
                    self.join_key,
                ],
                args=[item_id, cell, metrics_json],
            )
        )

    async def evict_self(self, cell: int) -> bool:
        """Leave the step and give back every claim, if the window is still open (a cell that was
        handed an item it had already processed: its claims were reclaimed while it lapsed). False
        when the window closed first: then the cell's gradient counts each of its items once."""
        return bool(
            await self._evict_self(
                keys=[self.join_key, self.evicted_key, self.processing_key(cell), self.pending_key],
                args=[cell],
            )
        )

    async def reset(self, cell: int) -> int:
        """Start this cell's part of the step over: its claims go back to the queue, its finished
        micro-steps and metrics are forgotten (the caller zeroes its gradients). What the core does
        instead of being evicted, since no step completes without it."""
        return int(
            await self._reset(
                keys=[self.processing_key(cell), self.pending_key, self.done_key(cell), self.metrics_key],
                args=[cell],
            )
        )

    async def release(self, cell: int) -> int:
        """Give every item this cell holds back to the head of the queue (after eviction)."""
        return int(await self._release(keys=[self.processing_key(cell), self.pending_key]))

    async def try_close(self) -> StepStatus:
        """Core: close the window if the step is complete (see the module docstring)."""
        _, cells, reason = await self._try_close(
            keys=[
                self.join_key,
                self.participants_key,
                self.evicted_key,
                self.heartbeats_key,
                self.pending_key,
                self.known_key,
                self.acked_key,
                self.closed_key,
                self.ready_key,
            ],
            args=[self.heartbeat_timeout_s, self.processing_prefix, self.done_prefix, CONSUMER_PREFIX],
        )
        status = await self.status(0)
        return StepStatus(
            state=status.state,
            step=status.step,
            final_in_burst=status.final_in_burst,
            cells=_cells(cells) or status.cells,
            version=status.version,
            reason=_text(reason) or "",
        )

    async def confirm(self, cell: int) -> bool:
        """A candidate of a closing window: this cell is alive and idle, ready to reduce."""
        return bool(await self._confirm(keys=[self.join_key, self.ready_key], args=[cell]))

    async def ack_all(self, cell: int) -> int:
        """After the reduction: acknowledge every item this cell holds (the queue then drains)."""
        return int(await self._ack_all(keys=[self.processing_key(cell), self.acked_key]))

    async def restart(self, num_cells: int) -> None:
        """Core, in a new process: void what an earlier core process's part of this step gathered and
        reopen the window (every claim back to the queue, finished marks forgotten, the satellites that
        had registered evicted: they leave the step at their next mark or status check)."""
        await self._restart(
            keys=[
                self.join_key,
                self.participants_key,
                self.evicted_key,
                self.ready_key,
                self.metrics_key,
                self.pending_key,
            ],
            args=[self.processing_prefix, self.done_prefix, CONSUMER_PREFIX, num_cells],
        )

    async def finish_replayed(self, num_cells: int, version: int) -> None:
        """Core: this step was taken again from its stored micro-steps (replay.py); it is done at `version`."""
        await self._finish_replayed(
            keys=[self.join_key, self.acked_key],
            args=[self.processing_prefix, CONSUMER_PREFIX, num_cells, version],
        )

    async def done_items(self, cells: tuple[int, ...]) -> list[str]:
        """The micro-steps the given cells finished (their gradients are in the reduction)."""
        out: list[str] = []
        for c in cells:
            out.extend(_text(i) or "" for i in await self._redis.smembers(self.done_key(c)))
        return out

    async def finish(self, version: int) -> None:
        """Core: the optimizer step produced `version`."""
        await self._redis.hset(self.join_key, mapping={"state": StepState.DONE.value, "version": version})

    async def wait_done(
        self, timeout_s: float, poll_s: float, check: Callable[[], None] | None = None
    ) -> StepStatus:
        """The status once the core finished the step; `check()` runs at every look and may raise to give up
        (a satellite whose world is re-formed because the core restarted: that core never finishes it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if check is not None:
                check()
            status = await self.status(-1)
            if status.state is StepState.DONE:
                return status
            if loop.time() >= deadline:
                raise TimeoutError(
                    f"the core did not finish the step of batch {self.batch_id!r} within {timeout_s} s"
                )
            await asyncio.sleep(poll_s)

    async def metrics(self, cells: tuple[int, ...]) -> dict[int, str]:
        """The metrics JSON each of `cells` recorded with its last `mark_done`."""
        raw = await self._redis.hmget(self.metrics_key, [str(c) for c in cells])
        return {c: _text(v) or "" for c, v in zip(cells, raw, strict=True) if v is not None}

    async def set_accumulated(self, cell: int, ids: list[str]) -> None:
        """A participant, before the reduction: the micro-steps its gradient holds, in the order it
        accumulated them (the core archives them with the step: step_archive.py)."""
        await self._redis.hset(self.accumulated_key, str(cell), json.dumps(ids))

    async def accumulated(self, cells: tuple[int, ...]) -> dict[int, list[str]]:
        """What each of `cells` recorded with `set_accumulated` (an empty list for a cell that did not)."""
        raw = await self._redis.hmget(self.accumulated_key, [str(c) for c in cells])
        return {c: json.loads(v) if v is not None else [] for c, v in zip(cells, raw, strict=True)}

    async def num_done(self, cells: tuple[int, ...]) -> int:
        counts = [await self._redis.scard(self.done_key(c)) for c in cells]
        return int(sum(counts))
