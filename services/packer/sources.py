"""Where the packer reads from: ready groups (the evaluator's outcomes in Redis) and the
execution trees (the proxy's tree store in Redis)."""

from __future__ import annotations

import redis.asyncio as aioredis

from gyre.log import get_logger
from gyre.rl.advantages import MemberReward, MemberStatus
from gyre.store import Keys
from gyre.store.groups import GroupOutcomes
from gyre.store.groups import ReadyGroup as StoredGroup
from gyre.store.trees import TreeStore, UnknownTreeError
from gyre.trajectory import TrajectoryTree
from services.packer.rows import ClaimedGroup

log = get_logger("gyre.packer.sources")


class GroupSource:
    """Claims ready groups for a batch, oldest policy version first, one at a time.

    Groups a batch claimed before a packer restart are handed out again first (their micro-steps
    and events carry deterministic ids, so re-packing them duplicates nothing).
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._outcomes = GroupOutcomes(redis, keys)
        self._earlier: dict[str, list[StoredGroup]] = {}
        """Per batch: groups it claimed before this packer started, not handed out again yet."""

    async def recover(self, batch_id: str) -> int:
        """Read the groups `batch_id` claimed before this packer started, now; returns how many. A packer
        resuming its open batches calls it before it consumes StepCompleted: archiving a committed batch
        deletes its claimed set, and a resumed stream that read the set only afterwards found it empty
        and claimed fresh ready groups into a batch already trained (they were then never trained)."""
        if batch_id not in self._earlier:
            self._earlier[batch_id] = await self._outcomes.claimed(batch_id)
        return len(self._earlier[batch_id])

    async def claim(self, batch_id: str) -> ClaimedGroup | None:
        await self.recover(batch_id)  # read once per batch; later claims come from the ready set
        earlier = self._earlier[batch_id]
        taken = [earlier.pop(0)] if earlier else await self._outcomes.claim_ready(1, batch_id)
        if not taken:
            return None
        group = taken[0]
        members = tuple(MemberReward(m.execution_id, MemberStatus(m.status), m.reward) for m in group.members)
        return ClaimedGroup(group.group_id, group.policy_version, members)


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
