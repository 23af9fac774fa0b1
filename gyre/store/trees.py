"""Trajectory trees in Redis: the proxy appends each commit's nodes, the packer loads closed trees.

    store = TreeStore(redis, Keys(run_id))
    await store.create(execution_id, profile="claude_code", template=template.name, policy_version=3)
    await store.append(execution_id, result.new_nodes + result.changed_nodes, num_sampled=n)
    await store.close(execution_id)
    tree = await store.load(execution_id)          # TrajectoryTree.from_nodes, `closed` kept
    if await store.is_closed(execution_id): ...

Two keys per execution, sharing the hash tag `{execution_id}`: `tree_nodes` (hash: node id →
`encode_node` bytes; a node written twice keeps the later encoding, which carries every alias
learned so far) and `tree_meta` (hash: profile, template, policy version, closed flag, counters,
and whatever extra fields the opener passes). An append is one Lua script: the nodes and the
counters land together or not at all, in one round trip.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from gyre.store.keys import Keys
from gyre.trajectory.codec import encode_node
from gyre.trajectory.node import Node
from gyre.trajectory.profiles import HarnessProfile, get_profile
from gyre.trajectory.templates.base import ChatTemplate
from gyre.trajectory.tree import TrajectoryTree

_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""

_CLOSE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], 'closed') ~= '1' then
  redis.call('HSET', KEYS[1], 'closed', '1', 'closed_at_s', ARGV[1])
end
return 1
"""

_APPEND = """
if #ARGV > 2 then redis.call('HSET', KEYS[1], unpack(ARGV, 3)) end
if ARGV[1] ~= '0' then redis.call('HINCRBY', KEYS[2], 'num_calls', ARGV[1]) end
if ARGV[2] ~= '0' then redis.call('HINCRBY', KEYS[2], 'num_sampled_tokens', ARGV[2]) end
return 1
"""

_CORE_FIELDS = frozenset(
    ("execution_id", "profile", "template", "policy_version", "closed", "opened_at_s", "closed_at_s")
)
_COUNTERS = ("num_calls", "num_sampled_tokens")


@dataclass(frozen=True, slots=True)
class TreeMeta:
    """What the store knows about one execution's tree besides its nodes."""

    execution_id: str
    profile: str
    """Harness profile the proxy classified the execution's calls with."""
    template: str
    """Name of the chat template the token ids were rendered with."""
    policy_version: int
    """Policy version when the execution opened."""
    closed: bool
    num_calls: int
    """Recorded model calls."""
    num_sampled_tokens: int
    """Engine-sampled tokens over all recorded outputs."""
    opened_at_s: float
    closed_at_s: float
    extra: dict[str, str] = field(default_factory=dict)


class UnknownTreeError(KeyError):
    """No tree is stored for this execution."""


class TreeStore:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._create = redis.register_script(_CREATE)
        self._close = redis.register_script(_CLOSE)
        self._append = redis.register_script(_APPEND)

    async def create(
        self,
        execution_id: str,
        *,
        profile: str,
        template: str,
        policy_version: int,
        extra: Mapping[str, str] | None = None,
    ) -> bool:
        """Register an execution's tree; False (and nothing changed) if it already exists."""
        clash = _CORE_FIELDS.intersection(extra or {}) | set(_COUNTERS).intersection(extra or {})
        if clash:
            raise ValueError(f"extra fields {sorted(clash)} are reserved by the tree store")
        fields: dict[str, str] = {
            "execution_id": execution_id,
            "profile": profile,
            "template": template,
            "policy_version": str(policy_version),
            "closed": "0",
            "opened_at_s": repr(time.time()),
            "closed_at_s": "0",
            **{counter: "0" for counter in _COUNTERS},
            **dict(extra or {}),
        }
        args = [x for kv in fields.items() for x in kv]
        return bool(await self._create(keys=[self._keys.tree_meta(execution_id)], args=args))

    async def append(
        self, execution_id: str, nodes: Iterable[Node], *, num_calls: int = 1, num_sampled: int = 0
    ) -> None:
        """Write nodes (encoded now, before the first await) and bump the call counters."""
        args: list[str | bytes] = [str(num_calls), str(num_sampled)]
        for node in nodes:
            args += [str(node.node_id), encode_node(node)]
        keys = [self._keys.tree_nodes(execution_id), self._keys.tree_meta(execution_id)]
        await self._append(keys=keys, args=args)

    async def close(self, execution_id: str) -> TreeMeta:
        """Mark the tree closed (idempotent); raises `UnknownTreeError` if there is none."""
        found = await self._close(keys=[self._keys.tree_meta(execution_id)], args=[repr(time.time())])
        if not found:
            raise UnknownTreeError(execution_id)
        meta = await self.meta(execution_id)
        assert meta is not None
        return meta

    async def meta(self, execution_id: str) -> TreeMeta | None:
        raw = await self._redis.hgetall(self._keys.tree_meta(execution_id))
        if not raw:
            return None
        data = {_text(k): _text(v) for k, v in raw.items()}
        return TreeMeta(
            execution_id=data["execution_id"],
            profile=data["profile"],
            template=data["template"],
            policy_version=int(data["policy_version"]),
            closed=data["closed"] == "1",
            num_calls=int(data.get("num_calls", 0)),
            num_sampled_tokens=int(data.get("num_sampled_tokens", 0)),
            opened_at_s=float(data.get("opened_at_s", 0)),
            closed_at_s=float(data.get("closed_at_s", 0)),
            extra={k: v for k, v in data.items() if k not in _CORE_FIELDS and k not in _COUNTERS},
        )

    async def is_closed(self, execution_id: str) -> bool:
        """True once `close` ran; False for an open or unknown execution."""
        flag = await self._redis.hget(self._keys.tree_meta(execution_id), "closed")
        return flag is not None and _text(flag) == "1"

    async def num_nodes(self, execution_id: str) -> int:
        return int(await self._redis.hlen(self._keys.tree_nodes(execution_id)))

    async def load(
        self,
        execution_id: str,
        template: ChatTemplate | None = None,
        profile: HarnessProfile | None = None,
    ) -> TrajectoryTree:
        """Rebuild the tree. Without `template` it is read-only (admission and materialization need only
        the recorded ids); without `profile` the stored profile name is used."""
        meta = await self.meta(execution_id)
        if meta is None:
            raise UnknownTreeError(execution_id)
        blobs = await self._redis.hvals(self._keys.tree_nodes(execution_id))
        return TrajectoryTree.from_nodes(
            execution_id,
            template,
            profile if profile is not None else get_profile(meta.profile),
            (b if isinstance(b, bytes) else b.encode() for b in blobs),
            closed=meta.closed,
        )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
