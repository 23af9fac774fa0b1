"""Counters and the reliable work queue against a real redis-server."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre.store import CounterInvariantError, Counters, Keys, WorkQueue


async def test_concurrent_counter_updates_keep_the_invariant(redis: aioredis.Redis, keys: Keys) -> None:
    counters = Counters(redis, keys)
    await counters.add("dispatched", 200)
    rejected = 0

    async def worker(seed: int) -> None:
        nonlocal rejected
        rng = random.Random(seed)
        for _ in range(40):
            field = rng.choice(["started", "finished", "finished", "dispatched"])
            try:
                values = await counters.add(field, 1)  # type: ignore[arg-type]
            except CounterInvariantError:
                rejected += 1
                continue
            assert values.dispatched >= values.started >= values.finished >= 0

    await asyncio.gather(*(worker(i) for i in range(50)))
    final = await counters.get()
    assert final.dispatched >= final.started >= final.finished >= 0
    assert rejected > 0  # finishing more than started must have been refused along the way


async def test_invalid_transition_names_the_error_and_changes_nothing(
    redis: aioredis.Redis, keys: Keys
) -> None:
    counters = Counters(redis, keys)
    await counters.add("dispatched", 2)
    await counters.add("started", 1)
    with pytest.raises(CounterInvariantError, match="p=1 f=2"):
        await counters.add("finished", 2)
    with pytest.raises(CounterInvariantError, match="d=2 p=3"):
        await counters.add("started", 2)
    assert await counters.get() == type(await counters.get())(2, 1, 0)


async def test_counter_tokens_make_updates_idempotent(redis: aioredis.Redis, keys: Keys) -> None:
    counters = Counters(redis, keys)
    await counters.add("dispatched", 1, token="g1")
    again = await counters.add("dispatched", 1, token="g1")
    assert again.applied is False and again.dispatched == 1


async def test_queue_put_is_idempotent_and_ack_is_exactly_once(redis: aioredis.Redis, keys: Keys) -> None:
    queue = WorkQueue(redis, keys, "q1")
    assert await queue.put("a", b"payload-a") is True
    assert await queue.put("a", b"payload-a") is False
    claim = await queue.claim("c1")
    assert claim is not None and claim.payload == b"payload-a"
    assert await queue.claim("c2") is None
    assert await queue.ack(claim) is True
    assert await queue.ack(claim) is False
    await queue.close()
    assert await queue.drained()


_DYING_CLAIMER = textwrap.dedent(
    """
    import asyncio, sys
    from gyre.store import Keys, WorkQueue, connect_redis

    async def main():
        redis = await connect_redis(sys.argv[1])
        queue = WorkQueue(redis, Keys(sys.argv[2]), "work", heartbeat_timeout_s=1.0)
        claim = await queue.claim("doomed", timeout_s=10)
        print("claimed", claim.item_id, flush=True)
        await asyncio.sleep(3600)  # scenario: it holds its claim until it is killed

    asyncio.run(main())
    """
)


async def test_item_of_a_dead_consumer_is_reclaimed_and_processed_exactly_once(
    redis: aioredis.Redis, keys: Keys, redis_server: ServerProcess, run_id: str
) -> None:
    queue = WorkQueue(redis, keys, "work", heartbeat_timeout_s=1.0)
    for i in range(5):
        await queue.put(f"item-{i}", f"p{i}".encode())
    await queue.close()
    proc = subprocess.Popen(
        [sys.executable, "-c", _DYING_CLAIMER, redis_server.url, run_id],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=30)  # type: ignore[union-attr]
        doomed_item = line.decode().split()[1]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    processed: list[str] = []

    async def survivor(name: str) -> None:
        while not await queue.drained():
            await queue.reclaim_dead()
            claim = await queue.claim(name, timeout_s=0.2)
            if claim is None:
                continue
            if await queue.ack(claim):
                processed.append(claim.item_id)

    await asyncio.wait_for(asyncio.gather(survivor("s1"), survivor("s2")), timeout=30)
    assert sorted(processed) == [f"item-{i}" for i in range(5)]
    assert processed.count(doomed_item) == 1


async def test_group_records_round_trip(redis: aioredis.Redis, keys: Keys) -> None:
    from gyre.store import ExecutionRecord, GroupRecord, Records

    records = Records(redis, keys)
    executions = [ExecutionRecord(f"e{i}", "g1", i, "q1", "add-3", 30.0, 60.0) for i in range(2)]
    group = GroupRecord("g1", "q1", "add-3", ("e0", "e1"), policy_version=2, burst=1, dispatched_at_ms=5)
    await records.put_group(group, executions)
    assert await records.get_group("g1") == group
    assert await records.get_execution("e1") == executions[1]
    assert await records.get_group("missing") is None
    with pytest.raises(ValueError, match="must match"):
        await records.put_group(group, executions[:1])
