"""The scheduler's cumulative counters d (dispatched), p (started), f (finished), atomic in Redis.

Each update is one Lua script that keeps d ≥ p ≥ f ≥ 0 and is idempotent per token: counting the
same execution's start twice (a redelivered event) changes nothing. An update that would break
the invariant raises `CounterInvariantError` and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from gyre.store.keys import Keys

Field = Literal["dispatched", "started", "finished"]
_SHORT: dict[str, str] = {"dispatched": "d", "started": "p", "finished": "f"}

_ADD = """
local field, n, token = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local d = tonumber(redis.call('HGET', KEYS[1], 'd') or '0')
local p = tonumber(redis.call('HGET', KEYS[1], 'p') or '0')
local f = tonumber(redis.call('HGET', KEYS[1], 'f') or '0')
if token ~= '' and redis.call('SISMEMBER', KEYS[2], token) == 1 then
  return {d, p, f, 0}
end
if field == 'd' then d = d + n elseif field == 'p' then p = p + n else f = f + n end
if f < 0 or p < f or d < p then
  return redis.error_reply('GYRE_COUNTER_INVARIANT ' .. field .. '+' .. ARGV[2] ..
    ' would give d=' .. d .. ' p=' .. p .. ' f=' .. f .. ' (need d >= p >= f >= 0)')
end
if token ~= '' then redis.call('SADD', KEYS[2], token) end
redis.call('HSET', KEYS[1], 'd', d, 'p', p, 'f', f)
return {d, p, f, 1}
"""


class CounterInvariantError(ValueError):
    """An update would break d ≥ p ≥ f ≥ 0 (e.g. finishing an execution that never started)."""


@dataclass(frozen=True, slots=True)
class CounterValues:
    dispatched: int
    started: int
    finished: int
    applied: bool = True
    """False when the update was a duplicate of an earlier one (same token)."""

    @property
    def queued(self) -> int:
        return self.dispatched - self.started

    @property
    def running(self) -> int:
        return self.started - self.finished

    @property
    def waterlevel(self) -> int:
        return self.dispatched - self.finished


class Counters:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._add = redis.register_script(_ADD)

    async def add(self, field: Field, n: int = 1, token: str | None = None) -> CounterValues:
        """Add `n` to one counter; with a `token`, a second call with the same token is a no-op."""
        if field not in _SHORT:
            raise ValueError(f"counter must be one of {sorted(_SHORT)}; got {field!r}")
        short = _SHORT[field]
        try:
            d, p, f, applied = await self._add(
                keys=[self._keys.counters(), self._keys.counter_seen(short)], args=[short, n, token or ""]
            )
        except ResponseError as e:
            if "GYRE_COUNTER_INVARIANT" in str(e):
                raise CounterInvariantError(str(e).split("GYRE_COUNTER_INVARIANT ", 1)[1]) from None
            raise
        return CounterValues(int(d), int(p), int(f), bool(applied))

    def seen_key(self, field: Field) -> str:
        """The set of tokens counted for `field` (archiving drops the tokens of trained groups)."""
        return self._keys.counter_seen(_SHORT[field])

    async def get(self) -> CounterValues:
        raw = await self._redis.hmget(self._keys.counters(), ["d", "p", "f"])
        d, p, f = (int(v) if v is not None else 0 for v in raw)
        return CounterValues(d, p, f)
