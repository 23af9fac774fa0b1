"""Dispatch records: what the scheduler writes when it dispatches a group, read by the runner,
the evaluator and the packer.

A group record and its N execution records are written in one MULTI/EXEC, so a reader never sees
a group without its executions.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import redis.asyncio as aioredis

from gyre.store.keys import Keys


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    execution_id: str
    group_id: str
    index_in_group: int
    query_id: str
    task_id: str
    harness_timeout_s: float
    overall_budget_s: float
    profile: str = "generic"
    """Harness profile the proxy classifies this execution's requests with."""


@dataclass(frozen=True, slots=True)
class GroupRecord:
    group_id: str
    query_id: str
    task_id: str
    execution_ids: tuple[str, ...]
    policy_version: int
    """v_d: the newest published policy version when the group was dispatched."""
    burst: int
    dispatched_at_ms: int
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.execution_ids)


class Records:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    async def put_group(self, group: GroupRecord, executions: list[ExecutionRecord]) -> None:
        """Write a group and its executions atomically (idempotent: same content, same keys)."""
        if [e.execution_id for e in executions] != list(group.execution_ids):
            raise ValueError("executions must match the group's execution_ids, in order")
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._keys.group(group.group_id), json.dumps(asdict(group)))
            for e in executions:
                pipe.set(self._keys.execution(e.execution_id), json.dumps(asdict(e)))
            await pipe.execute()

    async def get_group(self, group_id: str) -> GroupRecord | None:
        raw = await self._redis.get(self._keys.group(group_id))
        if raw is None:
            return None
        data = json.loads(raw)
        data["execution_ids"] = tuple(data["execution_ids"])
        return GroupRecord(**data)

    async def get_execution(self, execution_id: str) -> ExecutionRecord | None:
        raw = await self._redis.get(self._keys.execution(execution_id))
        return None if raw is None else ExecutionRecord(**json.loads(raw))
