"""The join window and reduction handshake of a step, against a real Redis: who registers, when the
window closes, and what happens to dead, lapsed and gapped participants."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import redis.asyncio as aioredis

from gyre.store import Keys, WorkQueue
from services.cell_agent.step_record import Registration, StepRecord, StepState, consumer_name
from services.cell_agent.step_runner import StepRunner

TIMEOUT_S = 0.5


def _record(redis: aioredis.Redis, keys: Keys, batch: str = "b1") -> StepRecord:
    return StepRecord(redis, keys, batch, heartbeat_timeout_s=TIMEOUT_S)


async def _fill(record: StepRecord, n: int, *, close: bool = True) -> None:
    for i in range(n):
        await record.queue.put(f"m{i}", b"x")
    if close:
        await record.queue.close()


async def _work(record: StepRecord, cell: int, count: int) -> list[str]:
    """Claim and finish up to `count` items as `cell`."""
    done = []
    for _ in range(count):
        claim = await record.queue.claim(consumer_name(cell))
        if claim is None:
            break
        assert await record.mark_done(cell, claim.item_id, "{}")
        done.append(claim.item_id)
    return done


def test_keys_follow_the_work_queue_layout(redis: aioredis.Redis, keys: Keys) -> None:
    record = _record(redis, keys)
    queue = WorkQueue(redis, keys, "microsteps:b1")
    assert (record.pending_key, record.known_key, record.acked_key) == (
        queue._pending,
        queue._known,
        queue._acked,
    )
    assert (record.payloads_key, record.heartbeats_key, record.closed_key) == (
        queue._payloads,
        queue._heartbeats,
        queue._closed,
    )
    assert record.processing_key(3) == queue._processing(consumer_name(3))


async def test_registration_needs_an_open_window_and_the_right_step(
    redis: aioredis.Redis, keys: Keys
) -> None:
    record = _record(redis, keys)
    assert await record.register(1, 4) is Registration.NOT_OPEN
    status = await record.open(4, final_in_burst=True)
    assert (status.state, status.step, status.final_in_burst) == (StepState.OPEN, 4, True)
    assert (await record.open(9, final_in_burst=False)).step == 4, "opening twice changes nothing"
    assert await record.register(1, 3) is Registration.WRONG_STEP
    assert await record.register(0, 4) is Registration.REGISTERED
    await _fill(record, 0)
    assert (await record.try_close()).cells == (0,)
    assert await record.register(1, 4) is Registration.CLOSED


async def test_window_closes_once_every_claim_is_done(redis: aioredis.Redis, keys: Keys) -> None:
    record = _record(redis, keys)
    await record.open(0, final_in_burst=False)
    for cell in (0, 1):
        assert await record.register(cell, 0) is Registration.REGISTERED
    await _fill(record, 4, close=False)
    assert (await record.try_close()).reason == "stream_open"
    await record.queue.close()
    assert (await record.try_close()).reason == "pending"
    await _work(record, 0, 2)
    held = await record.queue.claim(consumer_name(1))
    assert held is not None
    await _work(record, 1, 1)
    assert (await record.try_close()).reason == "computing", "cell 1 still computes its first claim"
    assert await record.mark_done(1, held.item_id, "{}")
    closing = await record.try_close()
    assert (closing.state, closing.cells, closing.reason) == (StepState.CLOSING, (0, 1), "confirming")
    assert await record.register(2, 0) is Registration.CLOSED, "no late joiner while the window closes"
    assert not await record.confirm(2), "only candidates confirm"
    assert await record.confirm(1)
    closed = await record.try_close()
    assert (closed.state, closed.cells) == (StepState.CLOSED, (0, 1))
    assert not await record.mark_done(1, "m9", "{}"), "nothing is marked after the window closed"
    assert await record.ack_all(0) == 2 and await record.ack_all(1) == 2
    assert await record.queue.drained()
    await record.finish(1)
    status = await record.status(1)
    assert (status.state, status.version, status.cells) == (StepState.DONE, 1, (0, 1))


async def test_a_dead_participant_is_left_out_and_its_claims_redone(
    redis: aioredis.Redis, keys: Keys
) -> None:
    record = _record(redis, keys)
    await record.open(0, final_in_burst=False)
    await record.register(0, 0)
    await record.register(1, 0)
    await _fill(record, 3)
    dead_done = await _work(record, 1, 2)  # cell 1 finishes two micro-steps, then dies
    assert (await record.try_close()).reason == "pending"
    await _work(record, 0, 1)
    await asyncio.sleep(TIMEOUT_S + 0.2)  # scenario: the heartbeat timeout lapses
    await record.heartbeat(0)
    assert (await record.try_close()).reason == "stale", "its claims are not back in the queue yet"
    assert sorted(await record.queue.reclaim_dead()) == sorted(dead_done)
    redone = await _work(record, 0, 5)
    assert sorted(redone) == sorted(dead_done), "finished-but-unreduced work of the dead cell is redone"
    closed = await record.try_close()
    assert closed.cells == (0,)


async def test_a_candidate_that_dies_before_confirming_is_left_out(redis: aioredis.Redis, keys: Keys) -> None:
    record = _record(redis, keys)
    await record.open(0, final_in_burst=True)
    for cell in (0, 1, 2):
        await record.register(cell, 0)
    await _fill(record, 3)
    for cell in (0, 1, 2):
        await _work(record, cell, 1)
    assert (await record.try_close()).cells == (0, 1, 2)
    assert await record.confirm(1)  # cell 2 died after its last micro-step: it never confirms
    assert (await record.try_close()).reason == "confirming"
    await asyncio.sleep(TIMEOUT_S + 0.2)  # scenario: the heartbeat timeout lapses
    for cell in (0, 1):
        await record.heartbeat(cell)
    reopened = await record.try_close()
    assert (reopened.state, reopened.reason) == (StepState.OPEN, "stale")
    assert len(await record.queue.reclaim_dead()) == 1
    await _work(record, 1, 5)
    assert (await record.try_close()).cells == (0, 1)
    assert await record.confirm(1)
    assert (await record.try_close()).state is StepState.CLOSED


async def test_a_lapsed_cell_whose_work_was_reclaimed_is_evicted(redis: aioredis.Redis, keys: Keys) -> None:
    record = _record(redis, keys)
    await record.open(0, final_in_burst=False)
    await record.register(0, 0)
    await record.register(1, 0)
    await _fill(record, 3)
    lapsed = await _work(record, 1, 1)
    await asyncio.sleep(TIMEOUT_S + 0.2)  # scenario: the heartbeat timeout lapses
    await record.heartbeat(0)
    assert await record.queue.reclaim_dead() == lapsed
    await _work(record, 0, 2)  # takes the reclaimed item and one more
    await record.heartbeat(1)  # it wakes up: alive again, but its gradient holds reclaimed work
    late = await record.queue.claim(consumer_name(1))
    assert late is not None
    assert (await record.try_close()).reason == "evicted"
    assert (await record.status(1)).evicted
    assert not await record.mark_done(1, late.item_id, "{}")
    assert await record.register(1, 0) is Registration.EVICTED
    await _work(record, 0, 5)
    assert (await record.try_close()).cells == (0,)


async def test_finishing_an_item_twice_evicts(redis: aioredis.Redis, keys: Keys) -> None:
    record = _record(redis, keys)
    await record.open(0, final_in_burst=False)
    for cell in (0, 1):
        await record.register(cell, 0)
    await _fill(record, 2)
    first = await _work(record, 1, 1)
    await asyncio.sleep(TIMEOUT_S + 0.2)  # scenario: the heartbeat timeout lapses
    await record.heartbeat(0)
    assert await record.queue.reclaim_dead() == first
    again = await record.queue.claim(consumer_name(1))  # its own item comes back to it
    assert again is not None and again.item_id == first[0]
    assert not await record.mark_done(1, again.item_id, "{}")
    assert (await record.status(1)).evicted


async def test_evict_self_only_while_open(redis: aioredis.Redis, keys: Keys) -> None:
    record = _record(redis, keys)
    await record.open(0, final_in_burst=False)
    await record.register(0, 0)
    await record.register(1, 0)
    await _fill(record, 2)
    await _work(record, 1, 1)
    assert await record.evict_self(1)
    assert await record.queue.pending() == 1 + 1, "its claim went back to the queue"
    await _work(record, 0, 5)
    assert (await record.try_close()).cells == (0,)
    assert not await record.evict_self(0)


async def test_a_live_cell_above_a_dead_one_is_evicted(redis: aioredis.Redis, keys: Keys) -> None:
    record = _record(redis, keys)
    await record.open(0, final_in_burst=True)
    for cell in (0, 1, 2):
        await record.register(cell, 0)
    await _fill(record, 2)
    await _work(record, 2, 2)
    await asyncio.sleep(TIMEOUT_S + 0.2)  # scenario: cell 1 never heartbeats again
    await record.heartbeat(0)
    await record.heartbeat(2)
    await record.queue.reclaim_dead()
    assert (await record.try_close()).reason == "evicted", "the reduction group must be a prefix {0..m-1}"
    assert (await record.status(2)).evicted
    assert await record.queue.pending() == 2, "cell 2's finished micro-steps are back in the queue"
    await _work(record, 0, 5)
    assert (await record.try_close()).cells == (0,)


async def test_mark_done_needs_ownership(redis: aioredis.Redis, keys: Keys) -> None:
    record = _record(redis, keys)
    await record.open(0, final_in_burst=False)
    await record.register(0, 0)
    await _fill(record, 1)
    claim = await record.queue.claim(consumer_name(0))
    assert claim is not None
    assert not await record.mark_done(1, claim.item_id, "{}")
    assert await record.release(0) == 1
    assert not await record.mark_done(0, claim.item_id, "{}")


async def test_the_core_is_never_evicted_it_starts_over(redis: aioredis.Redis, keys: Keys) -> None:
    record = _record(redis, keys)
    await record.open(0, final_in_burst=False)
    await record.register(0, 0)
    await record.register(1, 0)
    await _fill(record, 3)
    core_done = await _work(record, 0, 2)
    await asyncio.sleep(TIMEOUT_S + 0.2)  # scenario: the core's loop starved past the heartbeat timeout
    await record.heartbeat(1)
    assert sorted(await record.queue.reclaim_dead()) == sorted(core_done)
    await _work(record, 1, 5)  # the satellite redoes everything meanwhile
    await record.heartbeat(0)
    assert (await record.try_close()).reason == "core_reset", "unclean, but the core is not evicted"
    assert not (await record.status(0)).evicted
    assert await record.reset(0) == 0
    assert await redis.scard(record.done_key(0)) == 0
    assert (await record.try_close()).cells == (0, 1)


async def test_a_restarted_core_evicts_the_satellites_of_the_earlier_core(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """A core process that died inside a step and came back restarts it; a satellite that registered with
    the dead core is still inside the step (its claim loop runs on). It must find out and leave: were it
    merely forgotten, it would go on claiming and finishing items as a non-participant and the window
    could never close on them (seen in the compose bench's core-kill: the run stalled)."""
    record = _record(redis, keys)
    await record.open(4, final_in_burst=False)
    for cell in (0, 1, 2):
        assert await record.register(cell, 4) is Registration.REGISTERED
    await _fill(record, 3)
    held = await record.queue.claim(consumer_name(1))
    assert held is not None
    await record.restart(num_cells=3)  # the new core process
    for cell in (1, 2):
        assert (await record.status(cell)).evicted, f"cell {cell} of the earlier core is told to leave"
        assert await record.register(cell, 4) is Registration.EVICTED
    assert not (await record.status(0)).evicted and await record.register(0, 4) is Registration.REGISTERED
    again = await record.queue.claim(consumer_name(1))  # its loop claims once more before it looks
    assert again is not None and not await record.mark_done(1, again.item_id, "{}")
    assert await record.release(1) == 1
    assert sorted(await _work(record, 0, 5)) == ["m0", "m1", "m2"]
    assert (await record.try_close()).cells == (0,)


async def test_the_core_finishing_an_item_twice_is_told_not_evicted(
    redis: aioredis.Redis, keys: Keys
) -> None:
    record = _record(redis, keys)
    await record.open(0, final_in_burst=False)
    await record.register(0, 0)
    await _fill(record, 2)
    core_done = await _work(record, 0, 1)
    await asyncio.sleep(TIMEOUT_S + 0.2)  # scenario: the heartbeat timeout lapses
    assert await record.queue.reclaim_dead() == core_done
    again = await record.queue.claim(consumer_name(0))
    assert again is not None and again.item_id == core_done[0]
    assert not await record.mark_done(0, again.item_id, "{}")
    assert not (await record.status(0)).evicted
    assert await record.reset(0) == 1, "its claim goes back to the queue"
    await _work(record, 0, 5)
    assert (await record.try_close()).cells == (0,)


async def test_a_satellite_told_to_leave_gives_its_claims_back_at_once(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """StepRunner._consume of a satellite whose agent is stopping (`TrainingSide.leaving`, set by
    CellAgent.leave_step): while the window is open it evicts itself and every item it held, done or not,
    goes back to the head of the queue at once (not after its heartbeat lapses); it is left out of the step."""
    record = _record(redis, keys)
    await _fill(record, 4, close=False)
    await record.open(3, final_in_burst=True)
    assert await record.register(1, 3) is Registration.REGISTERED
    assert len(await _work(record, 1, 2)) == 2  # what it computed before it was told to stop
    await record.queue.claim(consumer_name(1))  # and one it holds, not done
    leaving = asyncio.Event()
    leaving.set()
    training = SimpleNamespace(
        cell=1,
        is_core=False,
        leaving=leaving,
        section=SimpleNamespace(poll_s=0.01, heartbeat_interval_s=1.0),
        world=SimpleNamespace(changed=lambda: False),
    )
    runner = StepRunner(training, emit=None, heartbeat_timeout_s=TIMEOUT_S)  # type: ignore[arg-type]
    status, _ = await asyncio.wait_for(runner._consume(record, 3), 10)
    assert status.evicted and status.state is StepState.OPEN
    assert await redis.llen(record.processing_key(1)) == 0
    assert await redis.llen(record.pending_key) == 4, "every item back in the queue"
    assert (await record.status(1)).evicted
