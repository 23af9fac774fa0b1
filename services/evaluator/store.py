"""Stored evaluations: each bound to (execution, workspace content hash), never overwritten.

    gyre:<run>:eval:{<execution>}:list    Redis list of evaluation JSON, oldest first

`put` appends an evaluation unless one for the same workspace hash is stored already, in which
case it returns the stored one (a redelivered termination re-uses the first evaluation instead
of scoring the same state twice). A later evaluation of a different state (a new artifact version)
is appended next to the earlier ones.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import redis.asyncio as aioredis

from gyre.store import Keys
from gyre.store.groups import OutcomeStatus

# KEYS: list; ARGV: workspace hash, evaluation json
_PUT = """
for _, raw in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  if cjson.decode(raw)['workspace_hash'] == ARGV[1] then return raw end
end
redis.call('RPUSH', KEYS[1], ARGV[2])
return ARGV[2]
"""


@dataclass(frozen=True, slots=True)
class Evaluation:
    execution_id: str
    status: OutcomeStatus
    reward: float
    workspace_path: str
    workspace_hash: str
    """Content hash of the evaluated state; empty for a placeholder (nothing was evaluated)."""
    attempts: int
    detail: str
    stored_at_ms: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> Evaluation:
        return cls(**json.loads(raw))


class EvaluationStore:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._put = redis.register_script(_PUT)

    async def put(self, evaluation: Evaluation) -> Evaluation:
        """Store unless this (execution, hash) has an evaluation; returns the stored one."""
        stamped = Evaluation(**{**asdict(evaluation), "stored_at_ms": int(time.time() * 1000)})
        raw = await self._put(
            keys=[self._keys.evaluations(evaluation.execution_id)],
            args=[evaluation.workspace_hash, stamped.to_json()],
        )
        return Evaluation.from_json(raw)

    async def all(self, execution_id: str) -> list[Evaluation]:
        """Every evaluation of the execution, oldest first."""
        return [
            Evaluation.from_json(r)
            for r in await self._redis.lrange(self._keys.evaluations(execution_id), 0, -1)
        ]

    async def first(self, execution_id: str) -> Evaluation | None:
        raw = await self._redis.lindex(self._keys.evaluations(execution_id), 0)
        return None if raw is None else Evaluation.from_json(raw)
