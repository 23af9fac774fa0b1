"""Where the packer reads from: ready groups (the evaluator's outcomes in Redis) and the
execution trees (the proxy's tree store in Redis)."""

from __future__ import annotations

import redis.asyncio as aioredis

from gyre.log import get_logger
from gyre.rl.advantages import MemberOutcome, MemberStatus
from gyre.store import Keys
from gyre.store.groups import GroupOutcomes
from gyre.store.trees import TreeStore, UnknownTreeError
from gyre.trajectory import TrajectoryTree
from services.packer.rows import ReadyGroup

log = get_logger("gyre.packer.sources")


class GroupSource:
    """Claims ready groups for a batch, oldest policy version first, one at a time.

    Groups a batch claimed before a packer restart are handed out again first (their micro-steps
    and events carry deterministic ids, so re-packing them duplicates nothing).
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._outcomes = GroupOutcomes(redis, keys)
        self._handed: dict[str, set[str]] = {}

    async def claim(self, batch_id: str) -> ReadyGroup | None:
        handed = self._handed.setdefault(batch_id, set())
        earlier = [g for g in await self._outcomes.claimed(batch_id) if g.group_id not in handed]
        taken = earlier[:1] or await self._outcomes.claim_ready(1, batch_id)
        if not taken:
            return None
        group = taken[0]
        handed.add(group.group_id)
        members = tuple(MemberOutcome(m.execution_id, MemberStatus(m.status), m.reward) for m in group.members)
        return ReadyGroup(group.group_id, group.policy_version, members)


class TreeSource:
    """Loads an execution's recorded tree; None when the proxy never opened one for it."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._trees = TreeStore(redis, keys)

    async def load(self, execution_id: str) -> TrajectoryTree | None:
        try:
            tree = await self._trees.load(execution_id)
        except UnknownTreeError:
            return None
        if not tree.closed:
            log.warning("tree_not_closed", execution=execution_id)
        return tree
