"""The training state the cells share through Redis (keys `gyre:<run>:trainer:{core}:*` and
`gyre:<run>:cell:{k}:*`):

    version      the core's policy version (the scheduler reads it to rebuild its state)
    snapshot     the core's SnapshotRecord, under a sequence lock (`seq` odd while the core changes
                 its weights): how a satellite knows the bytes it pulled are one whole version
    published    {version, path} of the newest published weights: what a cell loads on its way to rollout
    checkpointed the newest version the core has a checkpoint of (steps after it are replayed from their
                 micro-steps by a core that restarts; their payloads are kept until then)
    world        {generation, host, port, members}: the current torch.distributed world of the cells, the
                 core's rendezvous store of that generation and the incarnation of every member
    pulls        "<cell>:<generation>" entries: satellites waiting for the core to serve a `torch` pull
    cell k       engine: {engine_id, url, role, weight_version}; transitions: a sequence for event ids;
                 incarnation: a fresh id per process start, kept alive with a TTL (the core re-forms the world
                 when one changes)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import redis.asyncio as aioredis

from gyre.store import Keys
from gyre.weights.snapshot import SnapshotRecord


@dataclass(frozen=True, slots=True)
class SnapshotRead:
    record: SnapshotRecord
    seq: int


@dataclass(frozen=True, slots=True)
class Published:
    version: int
    path: str


@dataclass(frozen=True, slots=True)
class EngineEntry:
    cell: int
    engine_id: str
    url: str
    role: str
    weight_version: str


@dataclass(frozen=True, slots=True)
class WorldRecord:
    """One generation of the cells' torch.distributed world, as the core announces it."""

    generation: int
    host: str
    port: int
    """The core's rendezvous store of this generation."""
    members: tuple[str, ...]
    """The incarnation of every cell (index = cell) the world is formed with."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "generation": self.generation,
                "host": self.host,
                "port": self.port,
                "members": list(self.members),
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> WorldRecord:
        d = json.loads(raw)
        return cls(int(d["generation"]), str(d["host"]), int(d["port"]), tuple(str(m) for m in d["members"]))


def _s(raw: bytes | str | None) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


class TrainerState:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    # -- policy version ---------------------------------------------------------------------------
    async def set_version(self, version: int) -> None:
        await self._redis.set(self._keys.trainer("version"), version)

    async def version(self) -> int | None:
        raw = _s(await self._redis.get(self._keys.trainer("version")))
        return None if raw is None else int(raw)

    # -- snapshot under a sequence lock ------------------------------------------------------------
    async def begin_weights_change(self) -> int:
        """Core: the weights are about to change (seq becomes odd)."""
        seq = int(await self._redis.hincrby(self._keys.trainer("snapshot"), "seq", 1))
        assert seq % 2 == 1, f"snapshot seq {seq} should be odd while the weights change"
        return seq

    async def publish_snapshot(self, record: SnapshotRecord) -> int:
        """Core: the weights are now `record` (seq becomes even again); returns the new seq."""
        key = self._keys.trainer("snapshot")
        seq = int(_s(await self._redis.hget(key, "seq")) or 0)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, "record", record.to_json())
            pipe.hset(key, "seq", seq + (seq % 2))
            await pipe.execute()
        return seq + (seq % 2)

    async def read_snapshot(self) -> SnapshotRead | None:
        record, seq = await self._redis.hmget(self._keys.trainer("snapshot"), ["record", "seq"])
        if record is None:
            return None
        return SnapshotRead(SnapshotRecord.from_json(record), int(_s(seq) or 0))

    async def snapshot_seq(self) -> int:
        return int(_s(await self._redis.hget(self._keys.trainer("snapshot"), "seq")) or 0)

    # -- published weights -----------------------------------------------------------------------
    async def set_published(self, version: int, path: str) -> None:
        await self._redis.set(self._keys.trainer("published"), json.dumps({"version": version, "path": path}))

    async def published(self) -> Published | None:
        raw = await self._redis.get(self._keys.trainer("published"))
        if raw is None:
            return None
        data = json.loads(raw)
        return Published(int(data["version"]), str(data["path"]))

    async def wait_published(self, version: int, timeout_s: float, poll_s: float = 0.05) -> Published:
        """The newest publication once its version is at least `version`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            found = await self.published()
            if found is not None and found.version >= version:
                return found
            if loop.time() >= deadline:
                newest = "none" if found is None else f"version {found.version}"
                raise TimeoutError(
                    f"weights of version {version} were not published within {timeout_s} s (newest: {newest})"
                )
            await asyncio.sleep(poll_s)

    # -- checkpoints ----------------------------------------------------------------------------------
    async def set_checkpointed(self, version: int) -> None:
        await self._redis.set(self._keys.trainer("checkpointed"), version)

    async def checkpointed(self) -> int | None:
        raw = _s(await self._redis.get(self._keys.trainer("checkpointed")))
        return None if raw is None else int(raw)

    # -- the torch.distributed world of the cells ---------------------------------------------------
    async def set_world(self, world: WorldRecord) -> None:
        await self._redis.set(self._keys.trainer("world"), world.to_json())

    async def world(self) -> WorldRecord | None:
        raw = await self._redis.get(self._keys.trainer("world"))
        return None if raw is None else WorldRecord.from_json(raw)

    async def clear_world(self, generation: int) -> None:
        """Close the announced world if it is still `generation` (a core stopping): its record stays with no
        members, so no satellite joins it, and the next core numbers its world past it. Deleting the record
        restarted the count: a core recreated as a new process (Kubernetes replacing a deleted pod) formed
        generation 1 while the satellites, at a later one, follow only a newer generation, and never joined."""
        current = await self.world()
        if current is not None and current.generation == generation:
            await self.set_world(WorldRecord(generation, current.host, current.port, ()))

    async def set_incarnation(self, cell: int, incarnation: str, ttl_s: float) -> None:
        """This cell's process is alive as `incarnation` for the next `ttl_s` (refreshed while it runs)."""
        await self._redis.set(self._keys.cell(cell, "incarnation"), incarnation, px=int(ttl_s * 1000))

    async def incarnations(self, num_cells: int) -> list[str | None]:
        """Each cell's live incarnation (None: no live process registered)."""
        raw = await self._redis.mget([self._keys.cell(c, "incarnation") for c in range(num_cells)])
        return [_s(r) for r in raw]

    # -- pull requests of the torch transport -------------------------------------------------------
    async def request_pull(self, cell: int, generation: int = 0) -> None:
        await self._redis.rpush(self._keys.trainer("pulls"), f"{cell}:{generation}")

    async def next_pull(self) -> tuple[int, int] | None:
        """(satellite, world generation) of the oldest pull request."""
        raw = _s(await self._redis.lpop(self._keys.trainer("pulls")))
        if raw is None:
            return None
        cell, _, generation = raw.partition(":")
        return int(cell), int(generation or 0)

    # -- cells: engines and transition sequence -------------------------------------------------------
    async def set_engine(self, entry: EngineEntry) -> None:
        await self._redis.hset(
            self._keys.cell(entry.cell, "engine"),
            mapping={
                "engine_id": entry.engine_id,
                "url": entry.url,
                "role": entry.role,
                "weight_version": entry.weight_version,
            },
        )

    async def engines(self, num_cells: int) -> list[EngineEntry]:
        out: list[EngineEntry] = []
        for cell in range(num_cells):
            raw = await self._redis.hgetall(self._keys.cell(cell, "engine"))
            if raw:
                d = {_s(k): _s(v) for k, v in raw.items()}
                out.append(
                    EngineEntry(
                        cell,
                        str(d["engine_id"]),
                        str(d["url"]),
                        str(d["role"]),
                        str(d.get("weight_version") or ""),
                    )
                )
        return out

    async def next_transition(self, cell: int) -> int:
        return int(await self._redis.incr(self._keys.cell(cell, "transitions")))
