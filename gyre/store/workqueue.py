"""A reliable work queue in Redis (micro-steps, and any work that must survive a dead consumer).

    queue = WorkQueue(redis, keys, "microsteps:b7", heartbeat_timeout_s=10)
    await queue.put(item_id, payload)                # idempotent by id
    claim = await queue.claim("cell-1", timeout_s=1) # moves the id into cell-1's processing list
    ...process...
    if await queue.ack(claim): ...                   # True exactly once, and only for the owner

A claim moves the item atomically from `pending` into the consumer's processing list. Consumers
heartbeat (every claim does, and `heartbeat()` can be called while processing); `reclaim_dead()`
moves the items of consumers silent for longer than the timeout back to the head of `pending`.
`ack` succeeds only while the item is still in the caller's processing list, so an item is
acknowledged exactly once even if a slow consumer was declared dead and its item reclaimed.
After `close()`, `drained()` turns true once every item put has been acknowledged.

Keys share one hash tag per queue. The processing lists are named from the consumer id inside the
scripts (same slot), which Redis Cluster accepts for keys of one slot.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import redis.asyncio as aioredis

from gyre.store.keys import Keys

_PUT = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[1])
return 1
"""

# KEYS: pending, processing:<c>, payloads, heartbeats; ARGV: consumer
_CLAIM = """
local t = redis.call('TIME')
redis.call('ZADD', KEYS[4], tonumber(t[1]) + tonumber(t[2]) / 1e6, ARGV[1])
local id = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
if not id then return false end
return {id, redis.call('HGET', KEYS[3], id)}
"""

_HEARTBEAT = """
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], tonumber(t[1]) + tonumber(t[2]) / 1e6, ARGV[1])
return 1
"""

# KEYS: processing:<c>, acked, payloads; ARGV: id
_ACK = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"""

# KEYS: known, acked; ARGV: ids
_FORGET = """
local n = 0
for _, id in ipairs(ARGV) do
  if redis.call('SREM', KEYS[2], id) == 1 then
    redis.call('SREM', KEYS[1], id)
    n = n + 1
  end
end
return n
"""

# KEYS: heartbeats, pending; ARGV: timeout_s, processing key prefix
_RECLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[1])))
local moved = {}
for _, consumer in ipairs(dead) do
  local plist = ARGV[2] .. consumer
  local ids = redis.call('LRANGE', plist, 0, -1)
  for i = #ids, 1, -1 do
    redis.call('LPUSH', KEYS[2], ids[i])
    table.insert(moved, ids[i])
  end
  redis.call('DEL', plist)
  redis.call('ZREM', KEYS[1], consumer)
end
return moved
"""


@dataclass(frozen=True, slots=True)
class Claim:
    item_id: str
    payload: bytes
    consumer: str


class WorkQueue:
    def __init__(
        self, redis: aioredis.Redis, keys: Keys, name: str, heartbeat_timeout_s: float = 10.0
    ) -> None:
        if not name or "{" in name or "}" in name:
            raise ValueError(f"queue name must be non-empty without braces; got {name!r}")
        self._redis = redis
        self.name = name
        self.heartbeat_timeout_s = heartbeat_timeout_s
        k = lambda part: keys.queue(name, part)  # noqa: E731
        self._pending, self._payloads, self._known = k("pending"), k("payloads"), k("known")
        self._acked, self._heartbeats, self._closed = k("acked"), k("heartbeats"), k("closed")
        self._processing_prefix = k("processing:")
        self._put = redis.register_script(_PUT)
        self._claim = redis.register_script(_CLAIM)
        self._hb = redis.register_script(_HEARTBEAT)
        self._ack = redis.register_script(_ACK)
        self._reclaim = redis.register_script(_RECLAIM)
        self._forget = redis.register_script(_FORGET)

    def _processing(self, consumer: str) -> str:
        return self._processing_prefix + consumer

    async def put(self, item_id: str, payload: bytes) -> bool:
        """Enqueue; False when an item with this id was put before (idempotent producers)."""
        return bool(
            await self._put(keys=[self._known, self._payloads, self._pending], args=[item_id, payload])
        )

    async def claim(self, consumer: str, timeout_s: float = 0.0, poll_s: float = 0.05) -> Claim | None:
        """Claim the next item for `consumer`, waiting up to `timeout_s`; None if nothing came."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            got = await self._claim(
                keys=[self._pending, self._processing(consumer), self._payloads, self._heartbeats],
                args=[consumer],
            )
            if got:
                item_id, payload = got
                return Claim(item_id.decode(), bytes(payload or b""), consumer)
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(poll_s)

    async def heartbeat(self, consumer: str) -> None:
        await self._hb(keys=[self._heartbeats], args=[consumer])

    async def ack(self, claim: Claim) -> bool:
        """Acknowledge; True exactly once per item, and only while `claim.consumer` still owns it."""
        return bool(
            await self._ack(
                keys=[self._processing(claim.consumer), self._acked, self._payloads], args=[claim.item_id]
            )
        )

    async def reclaim_dead(self) -> list[str]:
        """Return the items of consumers silent for longer than the timeout to the queue head."""
        moved = await self._reclaim(
            keys=[self._heartbeats, self._pending], args=[self.heartbeat_timeout_s, self._processing_prefix]
        )
        return [m.decode() for m in moved]

    async def forget(self, item_ids: list[str]) -> int:
        """Drop acknowledged items from the id sets (`known`, `acked`) once their results are archived,
        so the sets stay bounded; an item not yet acknowledged is kept. Returns the number dropped. A
        forgotten id can be put again: forget only what no producer will redeliver."""
        if not item_ids:
            return 0
        return int(await self._forget(keys=[self._known, self._acked], args=list(item_ids)))

    async def close(self) -> None:
        """No more items will be put (the producer's stream of this queue is closed)."""
        await self._redis.set(self._closed, b"1")

    async def is_closed(self) -> bool:
        return bool(await self._redis.exists(self._closed))

    async def pending(self) -> int:
        return int(await self._redis.llen(self._pending))

    async def outstanding(self) -> int:
        """Items put and not yet acknowledged (pending + in processing)."""
        known, acked = await self._redis.scard(self._known), await self._redis.scard(self._acked)
        return int(known) - int(acked)

    async def drained(self) -> bool:
        """Closed and every item acknowledged."""
        return await self.is_closed() and await self.outstanding() == 0
