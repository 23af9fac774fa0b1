"""Persistence of the policy's state in Redis, so a restarted scheduler resumes the run.

After every applied event the driver writes one JSON document: counters, roles, versions, the
running executions and their engines (started, or start commanded and not yet confirmed), and the
outstanding groups. On start-up `restore` rebuilds the policy with `PolicyState.restore`; the
durable NATS consumer then resumes from the first unacknowledged event.
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from services.scheduler.policy import GroupRecord, Policy, PolicyParams, PolicyState, Role


def snapshot(policy: Policy, commanded: dict[str, int]) -> dict[str, Any]:
    s = policy.state
    running = {**commanded, **s.placement.assignments()}
    return {
        "dispatched": s.dispatched,
        "started": s.started,
        "finished": s.finished,
        "roles": [str(r) for r in s.roles],
        "version": s.version,
        "published_version": s.published_version,
        "burst": s.burst,
        "running": running,
        "groups": {
            g: [r.dispatch_version, r.ready, r.packed_step] for g, r in s.groups.items()
        },
        "now_s": s.now_s,
    }


async def save(redis: aioredis.Redis, key: str, policy: Policy, commanded: dict[str, int]) -> None:
    await redis.set(key, json.dumps(snapshot(policy, commanded)))


async def restore(redis: aioredis.Redis, key: str, params: PolicyParams) -> PolicyState | None:
    raw = await redis.get(key)
    if raw is None:
        return None
    data = json.loads(raw)
    roles = [Role(r) for r in data["roles"]]
    # A transition in flight when the scheduler stopped is settled by asking the cell agents again;
    # until then a draining cell counts as training and a returning one as training.
    roles = [Role.TRAINING if r in (Role.DRAINING, Role.RETURNING) else r for r in roles]
    groups = {
        g: GroupRecord(dispatch_version=v, ready=ready, packed_step=packed)
        for g, (v, ready, packed) in data["groups"].items()
    }
    return PolicyState.restore(
        params,
        dispatched=data["dispatched"],
        started=data["started"],
        finished=data["finished"],
        roles=roles,
        version=data["version"],
        published_version=data["published_version"],
        running={e: int(eng) for e, eng in data["running"].items()},
        groups=groups,
        burst=data["burst"],
        now_s=data["now_s"],
    )
