"""Group outcomes and readiness, atomic in Redis: a group becomes ready exactly once, and the
packer claims ready groups atomically, oldest policy version first.

    outcomes = GroupOutcomes(redis, keys)
    result = await outcomes.resolve(group_id, size=16, policy_version=3, outcome=MemberOutcome(...))
    if result.ready and await outcomes.claim_publication(group, token, lease_ms) == "claimed":
        ...publish GroupReady (event id `group.ready:<group>`); await outcomes.mark_published(group)...
    ready = await outcomes.list_ready()                  # packing order, unclaimed only
    taken = await outcomes.claim_ready(4, batch_id="b7")  # the 4 oldest, now claimed by b7

A member's outcome is recorded once (the first resolution of an execution wins; a duplicate
delivery changes nothing). When the number of recorded members reaches the group size, the same
Lua script marks the group ready and indexes it — so concurrent evaluators and redelivered
events can never make a group ready twice. Members carry what the packer needs: execution id,
status (`valid` / `excluded` / `placeholder`) and reward.

Keys (all under the `{ready}` hash tag of `Keys.ready_groups()`, one Redis Cluster slot):

    gyre:<run>:groups:{ready}:zset             ready, unclaimed groups; members sort in packing
                                               order: "<policy version>:<ready ms>:<group>"
    gyre:<run>:groups:{ready}:members:<group>  hash execution → outcome JSON
    gyre:<run>:groups:{ready}:meta:<group>     hash size, policy_version, state, ready_ms, batch, published,
                                               publishing (<token>:<lease end ms>)
    gyre:<run>:groups:{ready}:batch:<batch>    set of the groups a batch claimed
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis

from gyre.store.keys import Keys

OutcomeStatus = Literal["valid", "excluded", "placeholder"]
STATUSES: tuple[OutcomeStatus, ...] = ("valid", "excluded", "placeholder")

# KEYS: members, meta, ready zset; ARGV: execution, outcome json, size, policy version, group id
_RESOLVE = """
local added = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if redis.call('HSETNX', KEYS[2], 'size', ARGV[3]) == 1 then
  redis.call('HSET', KEYS[2], 'policy_version', ARGV[4], 'state', 'pending')
end
local size = tonumber(redis.call('HGET', KEYS[2], 'size'))
local resolved = redis.call('HLEN', KEYS[1])
local state = redis.call('HGET', KEYS[2], 'state')
if state == 'pending' and resolved >= size then
  local t = redis.call('TIME')
  local ready_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local version = tonumber(redis.call('HGET', KEYS[2], 'policy_version'))
  redis.call('HSET', KEYS[2], 'state', 'ready', 'ready_ms', ready_ms)
  redis.call('ZADD', KEYS[3], 0, string.format('%012d:%015d:%s', version, ready_ms, ARGV[5]))
  return {added, resolved, size, 1, 1}
end
return {added, resolved, size, 0, state == 'pending' and 0 or 1}
"""

# KEYS: ready zset, batch set; ARGV: n, batch id, key prefix ("gyre:<run>:groups:{ready}:")
_CLAIM = """
local items = redis.call('ZRANGEBYLEX', KEYS[1], '-', '+', 'LIMIT', 0, tonumber(ARGV[1]))
local groups = {}
for _, item in ipairs(items) do
  redis.call('ZREM', KEYS[1], item)
  local group = string.match(item, '^%d+:%d+:(.*)$')
  redis.call('HSET', ARGV[3] .. 'meta:' .. group, 'state', 'claimed', 'batch', ARGV[2])
  redis.call('SADD', KEYS[2], group)
  table.insert(groups, group)
end
return groups
"""

# KEYS: ready zset, batch set; ARGV: key prefix
_UNCLAIM = """
local groups = redis.call('SMEMBERS', KEYS[2])
for _, group in ipairs(groups) do
  local meta = ARGV[1] .. 'meta:' .. group
  local version = tonumber(redis.call('HGET', meta, 'policy_version'))
  local ready_ms = tonumber(redis.call('HGET', meta, 'ready_ms'))
  redis.call('HSET', meta, 'state', 'ready')
  redis.call('HDEL', meta, 'batch')
  redis.call('ZADD', KEYS[1], 0, string.format('%012d:%015d:%s', version, ready_ms, group))
end
redis.call('DEL', KEYS[2])
return groups
"""

# KEYS: meta; ARGV: token, lease ms. 'published' (or 'gone': archived), 'busy' while another token's
# lease runs, else 'claimed' (this token holds the publication until its lease lapses).
_CLAIM_PUBLICATION = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 'gone' end
if redis.call('HEXISTS', KEYS[1], 'published') == 1 then return 'published' end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('HGET', KEYS[1], 'publishing')
if held then
  local token, expires = string.match(held, '^(.*):(%d+)$')
  if token ~= ARGV[1] and tonumber(expires) > now then return 'busy' end
end
redis.call('HSET', KEYS[1], 'publishing', ARGV[1] .. ':' .. (now + tonumber(ARGV[2])))
return 'claimed'
"""

PublicationClaim = Literal["claimed", "busy", "published", "gone"]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class MemberOutcome:
    """The resolved outcome of one execution, as the packer reads it."""

    execution_id: str
    status: OutcomeStatus
    reward: float
    """Score in [0, 1] when valid; 0 for a placeholder; 0 and unused when excluded."""
    workspace_hash: str = ""
    """Content hash of the evaluated workspace (empty for a placeholder)."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"outcome status must be one of {STATUSES}; got {self.status!r}")
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"reward must be in [0, 1]; got {self.reward}")

    def to_json(self) -> str:
        return json.dumps(
            {"status": self.status, "reward": self.reward, "workspace_hash": self.workspace_hash}
        )

    @classmethod
    def from_json(cls, execution_id: str, raw: bytes | str) -> MemberOutcome:
        data = json.loads(raw)
        return cls(execution_id, data["status"], float(data["reward"]), data.get("workspace_hash", ""))


@dataclass(frozen=True, slots=True)
class ResolveResult:
    recorded: bool
    """False when this execution's outcome had been recorded before (duplicate delivery)."""
    resolved: int
    size: int
    became_ready: bool
    """True for exactly one resolve call per group: the one that completed it."""
    ready: bool
    """The group is ready (or already claimed by a batch)."""


@dataclass(frozen=True, slots=True)
class ReadyGroup:
    """A ready group with its members (what the packer consumes)."""

    group_id: str
    policy_version: int
    ready_time_s: float
    members: tuple[MemberOutcome, ...]
    state: str = "ready"
    batch_id: str = ""

    @property
    def mean_reward(self) -> float:
        """Mean over resolved members, placeholders counting 0, excluded members left out."""
        scored = [m.reward for m in self.members if m.status != "excluded"]
        return sum(scored) / len(scored) if scored else 0.0

    def count(self, status: OutcomeStatus) -> int:
        return sum(1 for m in self.members if m.status == status)


class GroupOutcomes:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._ready = keys.ready_groups()
        self._prefix = self._ready.removesuffix("zset")
        assert self._prefix.endswith("{ready}:"), "group keys must share the ready index's hash tag"
        self._resolve = redis.register_script(_RESOLVE)
        self._claim = redis.register_script(_CLAIM)
        self._unclaim = redis.register_script(_UNCLAIM)
        self._claim_publication = redis.register_script(_CLAIM_PUBLICATION)

    def _members(self, group_id: str) -> str:
        return f"{self._prefix}members:{group_id}"

    def _meta(self, group_id: str) -> str:
        return f"{self._prefix}meta:{group_id}"

    def _batch(self, batch_id: str) -> str:
        return f"{self._prefix}batch:{batch_id}"

    async def resolve(
        self, group_id: str, size: int, policy_version: int, outcome: MemberOutcome
    ) -> ResolveResult:
        """Record one member's outcome; the call that completes the group makes it ready."""
        if size < 1 or policy_version < 0:
            raise ValueError(
                f"group size must be positive and policy version non-negative; got {size}, {policy_version}"
            )
        recorded, resolved, stored_size, became_ready, ready = await self._resolve(
            keys=[self._members(group_id), self._meta(group_id), self._ready],
            args=[outcome.execution_id, outcome.to_json(), size, policy_version, group_id],
        )
        return ResolveResult(bool(recorded), int(resolved), int(stored_size), bool(became_ready), bool(ready))

    async def get(self, group_id: str) -> ReadyGroup | None:
        """A group's state and recorded members (any state); None when nothing was recorded."""
        meta = {_text(k): _text(v) for k, v in (await self._redis.hgetall(self._meta(group_id))).items()}
        if not meta:
            return None
        raw = await self._redis.hgetall(self._members(group_id))
        members = tuple(
            sorted(
                (MemberOutcome.from_json(_text(k), v) for k, v in raw.items()), key=lambda m: m.execution_id
            )
        )
        return ReadyGroup(
            group_id=group_id,
            policy_version=int(meta["policy_version"]),
            ready_time_s=int(meta.get("ready_ms", 0)) / 1000,
            members=members,
            state=meta["state"],
            batch_id=meta.get("batch", ""),
        )

    async def list_ready(self) -> list[ReadyGroup]:
        """Ready, unclaimed groups in packing order (oldest policy version, then oldest ready time)."""
        items = await self._redis.zrangebylex(self._ready, "-", "+")
        return await self._load([_text(item).split(":", 2)[2] for item in items])

    async def claim_ready(self, n: int, batch_id: str) -> list[ReadyGroup]:
        """Atomically take up to `n` oldest ready groups for `batch_id` (each is claimed once)."""
        if n < 1 or not batch_id:
            raise ValueError(f"claim needs n >= 1 and a batch id; got n={n}, batch_id={batch_id!r}")
        groups = await self._claim(
            keys=[self._ready, self._batch(batch_id)], args=[n, batch_id, self._prefix]
        )
        return await self._load([_text(g) for g in groups])

    async def claimed(self, batch_id: str) -> list[ReadyGroup]:
        """Groups claimed by `batch_id` (a restarted packer recovers its batch), packing order."""
        groups = [_text(g) for g in await self._redis.smembers(self._batch(batch_id))]
        loaded = await self._load(groups)
        return sorted(loaded, key=lambda g: (g.policy_version, g.ready_time_s, g.group_id))

    async def unclaim(self, batch_id: str) -> list[str]:
        """Return a batch's groups to the ready index (an abandoned batch); their order is kept."""
        groups = await self._unclaim(keys=[self._ready, self._batch(batch_id)], args=[self._prefix])
        return [_text(g) for g in groups]

    async def claimed_ids(self, batch_id: str) -> list[str]:
        """Ids of the groups `batch_id` claimed (whatever is left of their records), sorted."""
        return sorted(_text(g) for g in await self._redis.smembers(self._batch(batch_id)))

    def group_keys(self, group_id: str) -> tuple[str, ...]:
        """The group's outcome keys (members, meta): what archiving deletes once its step committed."""
        return self._members(group_id), self._meta(group_id)

    def batch_key(self, batch_id: str) -> str:
        """The set of the groups a batch claimed (deleted last when a committed batch is archived)."""
        return self._batch(batch_id)

    async def published(self, group_id: str) -> bool:
        """`GroupReady` of this group was published (see `mark_published`)."""
        return bool(await self._redis.hexists(self._meta(group_id), "published"))

    async def claim_publication(self, group_id: str, token: str, lease_ms: int) -> PublicationClaim:
        """Take the right to publish `GroupReady` of a ready group: `claimed` for one caller at a time
        (its `token`) until it marks the group published or its lease lapses (it died: the next caller
        takes over); `busy` while another's lease runs; `published` once marked; `gone` once archived."""
        return _text(await self._claim_publication(keys=[self._meta(group_id)], args=[token, lease_ms]))  # type: ignore[return-value]

    async def mark_published(self, group_id: str) -> bool:
        """Record that `GroupReady` was published; True the first time."""
        return bool(await self._redis.hsetnx(self._meta(group_id), "published", 1))

    async def _load(self, group_ids: list[str]) -> list[ReadyGroup]:
        loaded = [await self.get(g) for g in group_ids]
        return [g for g in loaded if g is not None]
