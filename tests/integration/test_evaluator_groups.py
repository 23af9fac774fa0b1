"""Group readiness in Redis: exactly once under concurrent and duplicate resolutions, and the
packer's atomic claim in packing order."""

from __future__ import annotations

import asyncio
import random

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.store import Keys
from gyre.store.groups import GroupOutcomes, MemberOutcome
from services.evaluator.store import Evaluation, EvaluationStore
from tests.support.eventually import eventually


def member(i: int, status: str = "valid", reward: float = 0.5) -> MemberOutcome:
    return MemberOutcome(f"e{i}", status, reward, f"h{i}")  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(1, 8), copies=st.integers(1, 4), seed=st.integers(0, 2**16))
async def test_a_group_becomes_ready_exactly_once(
    redis: aioredis.Redis, size: int, copies: int, seed: int
) -> None:
    outcomes = GroupOutcomes(redis, Keys(f"hyp{seed}x{size}x{copies}"))
    calls = [member(i) for i in range(size) for _ in range(copies)]
    random.Random(seed).shuffle(calls)
    results = await asyncio.gather(*(outcomes.resolve("g", size, 3, m) for m in calls))
    assert sum(r.became_ready for r in results) == 1
    assert sum(r.recorded for r in results) == size
    became = next(i for i, r in enumerate(results) if r.became_ready)
    assert all(not r.ready for r in results[:became] if r.resolved < size)
    group = await outcomes.get("g")
    assert group is not None and group.state == "ready" and len(group.members) == size
    assert [g.group_id for g in await outcomes.list_ready()] == ["g"]
    await redis.delete(
        *[k async for k in redis.scan_iter(match=Keys(f"hyp{seed}x{size}x{copies}").pattern())]
    )


async def test_one_caller_at_a_time_may_publish_a_ready_group_until_it_is_published(
    redis: aioredis.Redis, keys: Keys
) -> None:
    outcomes = GroupOutcomes(redis, keys)
    assert await outcomes.claim_publication("g", "t0", 10_000) == "gone"  # nothing recorded
    await outcomes.resolve("g", 1, 0, member(0))
    claims = await asyncio.gather(*(outcomes.claim_publication("g", f"t{i}", 10_000) for i in range(8)))
    assert sorted(claims) == ["busy"] * 7 + ["claimed"], claims
    holder = f"t{claims.index('claimed')}"
    assert await outcomes.claim_publication("g", holder, 10_000) == "claimed"  # its own claim, renewed
    assert await outcomes.mark_published("g")
    assert await outcomes.claim_publication("g", "late", 10_000) == "published"
    # A holder that dies before marking: once its lease lapses the next caller takes over.
    await outcomes.resolve("h", 1, 0, member(1))
    assert await outcomes.claim_publication("h", "dead", 1) == "claimed"
    claim = await eventually(  # 'busy' until the dead holder's 1 ms lease lapses
        lambda: _claimed(outcomes, "h", "next"), timeout_s=5, what="the lapsed lease taken over"
    )
    assert claim == "claimed"
    assert await outcomes.claim_publication("h", "dead", 10_000) == "busy"


async def _claimed(outcomes: GroupOutcomes, group_id: str, token: str) -> str | None:
    claim = await outcomes.claim_publication(group_id, token, 10_000)
    return claim if claim != "busy" else None


async def test_first_outcome_of_a_member_wins_and_an_incomplete_group_is_not_ready(
    redis: aioredis.Redis, keys: Keys
) -> None:
    outcomes = GroupOutcomes(redis, keys)
    first = await outcomes.resolve("g", 2, 0, member(0, "valid", 1.0))
    again = await outcomes.resolve("g", 2, 0, member(0, "excluded", 0.0))
    assert (first.recorded, again.recorded, again.ready, again.resolved) == (True, False, False, 1)
    assert await outcomes.list_ready() == []
    done = await outcomes.resolve("g", 2, 0, member(1, "placeholder", 0.0))
    assert done.became_ready
    group = await outcomes.get("g")
    assert group is not None
    assert [(m.status, m.reward) for m in group.members] == [("valid", 1.0), ("placeholder", 0.0)]
    assert group.mean_reward == 0.5 and group.count("placeholder") == 1


async def test_excluded_members_are_left_out_of_the_mean(redis: aioredis.Redis, keys: Keys) -> None:
    outcomes = GroupOutcomes(redis, keys)
    for m in (member(0, "valid", 0.8), member(1, "excluded", 0.0), member(2, "valid", 0.4)):
        await outcomes.resolve("g", 3, 0, m)
    group = await outcomes.get("g")
    assert group is not None and group.mean_reward == pytest.approx(0.6)


async def test_claim_takes_oldest_policy_version_first_then_oldest_ready_and_never_twice(
    redis: aioredis.Redis, keys: Keys
) -> None:
    outcomes = GroupOutcomes(redis, keys)
    for group, version in [("late-v1", 1), ("v2", 2), ("v0", 0), ("v10", 10)]:
        await outcomes.resolve(group, 1, version, member(0))
        await asyncio.sleep(0.002)  # scenario: each group gets a later ready time
    await outcomes.resolve("early-v1", 1, 1, member(0))  # readied after late-v1: same version, later
    assert [g.group_id for g in await outcomes.list_ready()] == ["v0", "late-v1", "early-v1", "v2", "v10"]
    claims = await asyncio.gather(*(outcomes.claim_ready(2, f"b{i}") for i in range(4)))
    taken = [g.group_id for claim in claims for g in claim]
    assert sorted(taken) == sorted(["v0", "late-v1", "early-v1", "v2", "v10"])
    assert await outcomes.list_ready() == []
    by_batch = {f"b{i}": [g.group_id for g in claim] for i, claim in enumerate(claims)}
    for batch, groups in by_batch.items():
        assert [g.group_id for g in await outcomes.claimed(batch)] == groups
        assert [(await outcomes.get(g)).batch_id for g in groups] == [batch] * len(groups)  # type: ignore[union-attr]
    abandoned = next(b for b, groups in by_batch.items() if groups)
    assert sorted(await outcomes.unclaim(abandoned)) == sorted(by_batch[abandoned])
    assert sorted(g.group_id for g in await outcomes.list_ready()) == sorted(by_batch[abandoned])
    with pytest.raises(ValueError, match="batch id"):
        await outcomes.claim_ready(1, "")


async def test_evaluations_are_bound_to_the_workspace_hash_and_never_overwritten(
    redis: aioredis.Redis, keys: Keys
) -> None:
    store = EvaluationStore(redis, keys)
    first = await store.put(Evaluation("e", "valid", 0.5, "/w", "h1", 1, "first"))
    again = await store.put(Evaluation("e", "valid", 1.0, "/w", "h1", 1, "second"))
    other = await store.put(Evaluation("e", "valid", 1.0, "/w", "h2", 1, "new state"))
    assert (again.reward, again.detail, again.stored_at_ms) == (0.5, "first", first.stored_at_ms)
    assert [(e.workspace_hash, e.reward) for e in await store.all("e")] == [("h1", 0.5), ("h2", 1.0)]
    assert other.detail == "new state" and (await store.first("e")) == first
