"""The packer's batch stream against real Redis and NATS: ready groups in, micro-steps out.

Checks the contract the training cells and the scheduler rely on: B groups packed oldest policy
version first, GroupPacked before any micro-step of the group, every valid execution's admitted
targets enqueued with coefficient 1/(L_i·B·N), excluded members without rows, the stream closed
exactly once, a restarted batch duplicating nothing, and `packer.row_layout: tree` enqueueing tree
rows that hold the same targets as path rows in fewer tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import redis.asyncio as aioredis
from google.protobuf.message import Message

from gyre.bus import Delivery, EventBus
from gyre.ids import batch_id as make_batch_id
from gyre.ids import microstep_queue
from gyre.rl.codec import decode_microstep
from gyre.store import Keys, WorkQueue
from gyre.store.groups import GroupOutcomes
from gyre.store.groups import MemberOutcome as StoredOutcome
from gyre.store.trees import TreeStore
from gyre.trajectory import CallMeta, TrajectoryTree, get_profile, template_for_family
from gyre.trajectory import Message as ChatMessage
from gyre.trajectory.messages import Api, ModelRequest
from gyre.v1 import events_pb2 as ev
from services.packer.batch import BatchProgress, fill_batch
from services.packer.sources import GroupSource, TreeSource
from tests.support.eventually import eventually

N = 2


async def _record_tree(store: TreeStore, execution_id: str, answer: str) -> int:
    """One model call: a prompt and a sampled answer; returns its sampled-token count."""
    await store.create(execution_id, profile="generic", template="embedded", policy_version=0)
    tree = TrajectoryTree(execution_id, template_for_family("chatml"), get_profile("generic"))
    prepared = tree.prepare(ModelRequest(Api.ANTHROPIC, ("Add.",), (ChatMessage.text("user", "2+3"),)))
    ids = [*answer.encode(), 258]
    result = tree.commit(
        prepared, ids, [-0.25] * len(ids), CallMeta(request_id=execution_id, policy_version=0)
    )
    await store.append(execution_id, [*result.new_nodes, *result.changed_nodes], num_sampled=len(ids))
    await store.close(execution_id)
    return len(ids)


async def _ready_group(
    outcomes: GroupOutcomes, store: TreeStore, group_id: str, version: int, rewards: list[float | None]
) -> dict[str, int]:
    """A ready group of N members; reward None = excluded. Returns sampled tokens per valid member."""
    targets: dict[str, int] = {}
    for i, reward in enumerate(rewards):
        eid = f"{group_id}-e{i}"
        if reward is None:
            outcome = StoredOutcome(eid, "excluded", 0.0)
        else:
            targets[eid] = await _record_tree(store, eid, f"answer {i} of {group_id}")
            outcome = StoredOutcome(eid, "valid", reward)
        await outcomes.resolve(group_id, size=len(rewards), policy_version=version, outcome=outcome)
    return targets


async def test_batch_stream_packs_b_groups_oldest_first(
    redis: aioredis.Redis, keys: Keys, bus: EventBus, run_id: str
) -> None:
    outcomes, store = GroupOutcomes(redis, keys), TreeStore(redis, keys)
    targets = {}
    targets |= await _ready_group(outcomes, store, "g-new", 2, [1.0, 0.0])
    targets |= await _ready_group(outcomes, store, "g-old", 0, [1.0, None])
    targets |= await _ready_group(outcomes, store, "g-mid", 1, [0.2, 0.2])

    seen: list[Message] = []

    async def record(event: Message, delivery: Delivery) -> None:
        seen.append(event)

    consumer = await bus.consume("observer", [ev.GroupPacked, ev.MicroStepEnqueued, ev.StreamClosed], record)
    batch = make_batch_id(run_id, 0)
    queue = WorkQueue(redis, keys, microstep_queue(batch))
    progress = BatchProgress(batch, step=0, num_groups=2, policy_version=2)
    await fill_batch(
        progress,
        claim_group=GroupSource(redis, keys).claim,
        load_tree=TreeSource(redis, keys).load,
        queue=queue,
        bus=bus,
        num_batch_executions=2 * N,
        token_budget=4096,
        j_max=5,
        run_seed=0,
        normalize_std=False,
        row_layout="tree",
    )
    assert progress.closed and progress.groups_packed == 2
    packed = [e.group_id for e in seen if isinstance(e, ev.GroupPacked)]
    # Oldest policy version first; the newest group is left for the next batch.
    assert packed == ["g-old", "g-mid"]
    staleness = {e.group_id: e.staleness for e in seen if isinstance(e, ev.GroupPacked)}
    assert staleness == {"g-old": 2, "g-mid": 1}
    await eventually(lambda: any(isinstance(e, ev.StreamClosed) for e in seen), what="StreamClosed")
    await consumer.stop()
    order = [type(e).__name__ for e in seen]
    assert order[0] == "GroupPacked" and order[-1] == "StreamClosed" and order.count("StreamClosed") == 1
    closed = next(e for e in seen if isinstance(e, ev.StreamClosed))
    # g-old: the excluded member does not count (mean 1.0); g-mid: 0.2. The batch's reward: their mean.
    assert closed.num_groups == 2 and closed.mean_reward == pytest.approx((1.0 + 0.2) / 2)

    steps = []
    while (claim := await queue.claim("cell-0")) is not None:
        steps.append(decode_microstep(claim.payload))
        assert await queue.ack(claim)
    assert await queue.drained()
    executions = {e for s in steps for e in s.execution_ids}
    # g-old's excluded member has no rows; g-mid's members have zero advantage but are still packed.
    assert executions == {"g-old-e0", "g-mid-e0", "g-mid-e1"}
    for s in steps:
        for local, eid in enumerate(s.execution_ids):
            mask = (s.execution_index == local) & s.target_mask
            l_i = int(mask.sum())
            assert l_i == targets[eid]
            np.testing.assert_allclose(s.coefficients[mask], 1.0 / (l_i * 2 * N))
    advantages = {eid: float(a) for s in steps for eid, a in zip(s.execution_ids, s.advantages, strict=True)}
    assert advantages["g-old-e0"] == 0.0  # the only resolved member of its group
    assert advantages["g-mid-e0"] == advantages["g-mid-e1"] == 0.0


async def test_a_restarted_batch_duplicates_nothing(
    redis: aioredis.Redis, keys: Keys, bus: EventBus, run_id: str
) -> None:
    outcomes, store = GroupOutcomes(redis, keys), TreeStore(redis, keys)
    await _ready_group(outcomes, store, "g1", 0, [1.0, 0.0])
    await _ready_group(outcomes, store, "g2", 0, [0.5, 0.0])
    batch = make_batch_id(run_id, 3)
    queue = WorkQueue(redis, keys, microstep_queue(batch))
    kwargs = dict(
        load_tree=TreeSource(redis, keys).load,
        queue=queue,
        bus=bus,
        num_batch_executions=2 * N,
        token_budget=64,
        j_max=5,
        run_seed=0,
        normalize_std=False,
        row_layout="paths",
    )
    first = GroupSource(redis, keys)
    await first.claim(batch)  # a packer claimed g1, then died before packing it
    progress = BatchProgress(batch, step=3, num_groups=2, policy_version=0)
    await fill_batch(progress, claim_group=GroupSource(redis, keys).claim, **kwargs)  # type: ignore[arg-type]
    assert progress.groups_packed == 2
    assert await queue.outstanding() == progress.microsteps_enqueued


async def _record_retried_tree(store: TreeStore, execution_id: str) -> None:
    """A call, its follow-up, and the follow-up retried: two leaves that share the first call."""
    await store.create(execution_id, profile="generic", template="embedded", policy_version=0)
    tree = TrajectoryTree(execution_id, template_for_family("chatml"), get_profile("generic"))
    task = ChatMessage.text("user", "Add 2 and 3, then double it.")
    first = tree.prepare(ModelRequest(Api.ANTHROPIC, ("Add.",), (task,)))
    ids = [*b"5", 258]
    result = tree.commit(first, ids, [-0.5] * len(ids), CallMeta(request_id="r0", policy_version=0))
    nodes = [*result.new_nodes]
    assert result.output is not None
    history = (task, result.output.to_message(), ChatMessage.text("user", "Now double it."))
    for k, answer in enumerate([b"10", b"ten"]):
        prepared = tree.prepare(ModelRequest(Api.ANTHROPIC, ("Add.",), history))
        ids = [*answer, 258]
        result = tree.commit(
            prepared, ids, [-0.5] * len(ids), CallMeta(request_id=f"r{k + 1}", policy_version=0)
        )
        nodes += [*result.new_nodes, *result.changed_nodes]
    await store.append(execution_id, nodes, num_sampled=9)
    await store.close(execution_id)


@pytest.mark.parametrize("row_layout", ["paths", "tree"])
async def test_row_layout_tree_enqueues_tree_rows_with_the_same_targets(
    redis: aioredis.Redis, keys: Keys, bus: EventBus, run_id: str, row_layout: str
) -> None:
    outcomes, store = GroupOutcomes(redis, keys), TreeStore(redis, keys)
    for i, reward in enumerate([1.0, 0.0]):
        await _record_retried_tree(store, f"g-e{i}")
        await outcomes.resolve(
            "g", size=N, policy_version=0, outcome=StoredOutcome(f"g-e{i}", "valid", reward)
        )
    seen: list[Message] = []

    async def record(event: Message, delivery: Delivery) -> None:
        seen.append(event)

    consumer = await bus.consume("observer", [ev.GroupPacked], record)
    batch = make_batch_id(run_id, 0)
    queue = WorkQueue(redis, keys, microstep_queue(batch))
    await fill_batch(
        BatchProgress(batch, step=0, num_groups=1, policy_version=0),
        claim_group=GroupSource(redis, keys).claim,
        load_tree=TreeSource(redis, keys).load,
        queue=queue,
        bus=bus,
        num_batch_executions=N,
        token_budget=4096,
        j_max=5,
        run_seed=0,
        normalize_std=False,
        row_layout=row_layout,  # type: ignore[arg-type]
    )
    claim = await queue.claim("cell-0")
    assert claim is not None and await queue.claim("cell-0") is None
    step = decode_microstep(claim.payload)
    # each execution: 3 outputs ("5", "10", "ten"), two admitted trajectories
    assert step.num_targets == 2 * (2 + 3 + 4) and sorted(step.execution_num_targets) == [9, 9]
    if row_layout == "tree":
        assert step.tree is not None and step.num_rows == N
        paths = step.as_path_rows()
        assert paths.num_rows == 2 * N and paths.num_tokens > step.num_tokens
    else:
        assert step.tree is None and step.num_rows == 2 * N
    await eventually(lambda: any(isinstance(e, ev.GroupPacked) for e in seen), what="GroupPacked")
    await consumer.stop()
    (packed,) = [e for e in seen if isinstance(e, ev.GroupPacked)]
    assert packed.num_trajectories == 2 * N and packed.num_targets == 18


async def test_a_resumed_batch_keeps_the_groups_it_claimed_when_its_step_is_archived_first(
    redis: aioredis.Redis, keys: Keys, run_id: str
) -> None:
    """A whole-run crash after a batch's stream closed but before the packer dropped it from the open
    batches: the restarted packer resumes the batch, and the restarted core's replay commits its step at
    once, so the archiver may delete the batch's claimed set before the resumed stream asks for a group.
    The groups it had claimed were read at resume (`recover`), so the stream hands out those again and
    never claims a fresh ready group into the trained batch (seen once in the resume test: two groups
    counted as trained in the events and never trained)."""
    outcomes, store = GroupOutcomes(redis, keys), TreeStore(redis, keys)
    await _ready_group(outcomes, store, "g1", 0, [1.0, 0.0])
    await _ready_group(outcomes, store, "g2", 0, [0.5, 0.0])
    batch = make_batch_id(run_id, 1)
    assert (await GroupSource(redis, keys).claim(batch)).group_id == "g1"  # the first packer's life
    resumed = GroupSource(redis, keys)
    assert await resumed.recover(batch) == 1
    await redis.delete(outcomes.batch_key(batch))  # what archiving the committed step deletes last
    again = await resumed.claim(batch)
    assert again is not None and again.group_id == "g1", again
    assert [g.group_id for g in await outcomes.list_ready()] == ["g2"], "no fresh group went to the batch"
