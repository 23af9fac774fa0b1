"""HttpShards: the least-loaded shard serves, a new one opens only when every shard is full, and never more
than `max_shards` (then the least-loaded one queues in its own small pool)."""

from __future__ import annotations

import ssl

import httpx

from gyre.engine.shards import HttpShards


async def test_shards_grow_only_when_every_shard_is_full_and_stop_at_the_maximum() -> None:
    made: list[ssl.SSLContext | bool] = []

    def factory(verify: ssl.SSLContext | bool) -> httpx.AsyncClient:
        made.append(verify)
        return httpx.AsyncClient(base_url="http://127.0.0.1:1", verify=verify)

    shards = HttpShards(factory, per_shard=2, max_shards=3)
    held = [shards.acquire() for _ in range(2)]
    assert len(shards.shards) == 1 and held[0] is held[1]
    third = shards.acquire()  # the first is full: a second shard
    assert len(shards.shards) == 2 and third is not held[0]
    shards.release(held[0])
    assert shards.acquire() is held[0]  # least loaded again: no new shard
    for _ in range(4):
        shards.acquire()
    # fill shard 1, open shard 2 and fill it; at the maximum the least-loaded full shard takes the last one
    assert [s.in_flight for s in shards.shards] == [3, 2, 2]
    assert len({id(v) for v in made}) == 1 and isinstance(made[0], ssl.SSLContext)  # one SSL context for all
    await shards.aclose()


async def test_a_given_client_is_the_only_shard() -> None:
    client = httpx.AsyncClient(base_url="http://127.0.0.1:1")
    shards = HttpShards.of(client)
    assert {id(shards.acquire().client) for _ in range(5)} == {id(client)} and len(shards.shards) == 1
    assert shards.first is client
    await client.aclose()
