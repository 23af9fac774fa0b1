"""Which runner owns which execution, in Redis, so a restarted runner can reconcile.

    claim key   gyre:<run>:exec:{<execution>}:runner    SET NX → "<runner id>", then
                                                        "done:<runner id>:<termination reason>" (the
                                                        reason's name: COMPLETED, CANCELLED, ...)
    owned hash  gyre:<run>:runner:{<runner id>}:owned   execution id → OwnedExecution JSON

A start request is run only by the runner that claims it (a redelivered request for a claimed or
finished execution is skipped). The owned record is written before the sandbox starts and
updated with the sandbox's identity right after, so after a crash the runner finds every
execution it may have left running (see `RunnerService.reconcile`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import redis.asyncio as aioredis

from gyre.sandbox import SandboxState
from gyre.store import Keys


@dataclass(frozen=True, slots=True)
class OwnedExecution:
    execution_id: str
    group_id: str
    index_in_group: int
    query_id: str
    task_id: str
    engine_id: str
    profile: str
    started_at_ms: int
    harness_deadline_ms: int
    """min(harness timeout, overall budget) after start."""
    budget_deadline_ms: int
    """Overall budget after start (evaluation retries stop there too)."""
    workspace: str
    proxy_opened: bool = False
    sandbox: SandboxState | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def with_sandbox(self, state: SandboxState) -> OwnedExecution:
        return replace(self, sandbox=state)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> OwnedExecution:
        data: dict[str, Any] = json.loads(raw)
        sandbox = data.pop("sandbox", None)
        return cls(**data, sandbox=SandboxState(**sandbox) if sandbox else None)


class Ownership:
    def __init__(self, redis: aioredis.Redis, keys: Keys, runner_id: str) -> None:
        self._redis = redis
        self._keys = keys
        self.runner_id = runner_id
        self._owned_key = keys.runner_owned(runner_id)

    def _claim_key(self, execution_id: str) -> str:
        return self._keys.execution_runner(execution_id)

    async def claim(self, execution_id: str) -> bool:
        """True when this runner may run the execution (fresh claim, or its own unfinished one)."""
        key = self._claim_key(execution_id)
        if await self._redis.set(key, self.runner_id, nx=True):
            return True
        holder = await self._redis.get(key)
        return holder == self.runner_id.encode() and not await self._redis.hexists(
            self._owned_key, execution_id
        )

    async def holder(self, execution_id: str) -> str | None:
        raw = await self._redis.get(self._claim_key(execution_id))
        return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)

    async def record(self, owned: OwnedExecution) -> None:
        await self._redis.hset(self._owned_key, owned.execution_id, owned.to_json())

    async def forget(self, execution_id: str, reason: str) -> None:
        """The execution is terminated (`reason`, a TerminationReason name) and reported: mark the claim
        done with the reason (the runner's own record of how it ended, which `gyre audit` reads), drop
        the record."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self._claim_key(execution_id), f"done:{self.runner_id}:{reason}")
            pipe.hdel(self._owned_key, execution_id)
            await pipe.execute()

    async def owned(self) -> list[OwnedExecution]:
        raw = await self._redis.hgetall(self._owned_key)
        return sorted((OwnedExecution.from_json(v) for v in raw.values()), key=lambda o: o.started_at_ms)
