"""The training state the cells share through Redis (keys `gyre:<run>:trainer:{core}:*` and
`gyre:<run>:cell:{k}:*`):

    version      the core's policy version (the scheduler reads it to rebuild its state)
    snapshot     the core's SnapshotRecord, under a sequence lock (`seq` odd while the core changes
                 its weights): how a satellite knows the bytes it pulled are one whole version
    published    {version, path} of the newest published weights: what a cell loads on its way to rollout
    rendezvous   {host, port} of the core's torch.distributed store (when `dist_port` is 0)
    pulls        a list of satellite indices waiting for the core to serve a `torch`-transport pull
    cell k       engine: {engine_id, url, role, weight_version}; transitions: a sequence for event ids
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
                raise TimeoutError(f"weights of version {version} were not published within {timeout_s} s "
                                   f"(newest: {newest})")
            await asyncio.sleep(poll_s)

    # -- rendezvous of the torch.distributed world --------------------------------------------------
    async def set_rendezvous(self, host: str, port: int) -> None:
        await self._redis.set(self._keys.trainer("rendezvous"), json.dumps({"host": host, "port": port}))

    async def clear_rendezvous(self) -> None:
        await self._redis.delete(self._keys.trainer("rendezvous"))

    async def rendezvous(self) -> tuple[str, int] | None:
        raw = await self._redis.get(self._keys.trainer("rendezvous"))
        if raw is None:
            return None
        data = json.loads(raw)
        return str(data["host"]), int(data["port"])

    # -- pull requests of the torch transport -------------------------------------------------------
    async def request_pull(self, cell: int) -> None:
        await self._redis.rpush(self._keys.trainer("pulls"), cell)

    async def next_pull(self) -> int | None:
        raw = await self._redis.lpop(self._keys.trainer("pulls"))
        return None if raw is None else int(str(_s(raw)))  # type: ignore[arg-type]

    # -- cells: engines and transition sequence -------------------------------------------------------
    async def set_engine(self, entry: EngineEntry) -> None:
        await self._redis.hset(
            self._keys.cell(entry.cell, "engine"),
            mapping={"engine_id": entry.engine_id, "url": entry.url, "role": entry.role,
                     "weight_version": entry.weight_version},
        )

    async def engines(self, num_cells: int) -> list[EngineEntry]:
        out: list[EngineEntry] = []
        for cell in range(num_cells):
            raw = await self._redis.hgetall(self._keys.cell(cell, "engine"))
            if raw:
                d = {_s(k): _s(v) for k, v in raw.items()}
                out.append(EngineEntry(cell, str(d["engine_id"]), str(d["url"]), str(d["role"]),
                                       str(d.get("weight_version") or "")))
        return out

    async def next_transition(self, cell: int) -> int:
        return int(await self._redis.incr(self._keys.cell(cell, "transitions")))
