"""Bounded state against real Redis and NATS: once the step that consumed a group commits, every key of
the group leaves Redis, and the run's archive reads back the identical trees and records.

The group is left in Redis the way the services leave it (scheduler records and counters, the proxy's
keys and tree, the runner's claim, the evaluator's queue item, evaluation and outcome), the real packer
service packs it and archives it when the core's `StepCompleted` arrives. A crash between archive and
delete and a redelivered `StepCompleted` lose and duplicate nothing.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis
from typer.testing import CliRunner

from app.cli import app
from app.stack.servers import ServerProcess
from gyre.bus import EventBus
from gyre.config import load_config
from gyre.ids import EVALUATIONS_QUEUE, batch_id, microstep_queue
from gyre.store import Counters, ExecutionRecord, GroupRecord, Keys, Records, WorkQueue
from gyre.store.archive import (
    REPLAY_PARTS,
    StepArchiver,
    archived_batches,
    batch_path,
    group_path,
    load_archived_group,
)
from gyre.store.groups import GroupOutcomes, MemberOutcome
from gyre.store.trees import TreeStore
from gyre.trajectory import CallMeta, TrajectoryTree, admit, get_profile, template_for_family
from gyre.trajectory import Message as ChatMessage
from gyre.trajectory.archive import archived_trees, load_archived_tree, read_archived_tree, tree_path
from gyre.trajectory.messages import Api, ModelRequest
from gyre.v1 import events_pb2 as ev
from services.evaluator.service import QUEUE
from services.evaluator.store import Evaluation, EvaluationStore
from services.packer.service import PackerService
from services.proxy.credentials import Credentials
from services.runner.ownership import Ownership
from tests.support.eventually import eventually

N = 2


@dataclass
class Written:
    group_id: str
    execution_ids: list[str]
    blobs: dict[str, dict[bytes, bytes]]
    """Per execution: the tree's node hash as Redis held it."""


async def _call(store: TreeStore, tree: TrajectoryTree, eid: str, prompt: str, answer: str) -> None:
    """One recorded model call, written as the proxy writes it."""
    prepared = tree.prepare(ModelRequest(Api.ANTHROPIC, ("Add.",), (ChatMessage.text("user", prompt),)))
    ids = [*answer.encode(), 258]
    done = tree.commit(prepared, ids, [-0.25 - 0.01 * i for i in range(len(ids))], CallMeta(request_id=eid))
    await store.append(eid, [*done.new_nodes, *done.changed_nodes], num_sampled=len(ids))


async def leave_group(
    redis: aioredis.Redis, keys: Keys, group_id: str, rewards: list[float | None]
) -> Written:
    """A dispatched, run, evaluated and ready group, as the services leave it in Redis (reward None =
    an execution that never started: a placeholder without a tree)."""
    eids = [f"{group_id}-e{i:02d}" for i in range(len(rewards))]
    records, counters = Records(redis, keys), Counters(redis, keys)
    await records.put_group(
        GroupRecord(
            group_id, "add/1+2", "add/1+2", tuple(eids), policy_version=0, burst=0, dispatched_at_ms=1
        ),
        [ExecutionRecord(e, group_id, i, "add/1+2", "add/1+2", 60.0, 120.0) for i, e in enumerate(eids)],
    )
    await counters.add("dispatched", len(eids), token=group_id)
    store, credentials, evaluations = (
        TreeStore(redis, keys),
        Credentials(redis, keys),
        EvaluationStore(redis, keys),
    )
    ownership, queue, outcomes = (
        Ownership(redis, keys, "runner-0"),
        WorkQueue(redis, keys, QUEUE),
        GroupOutcomes(redis, keys),
    )
    blobs: dict[str, dict[bytes, bytes]] = {}
    for i, (eid, reward) in enumerate(zip(eids, rewards, strict=True)):
        if reward is not None:
            assert await ownership.claim(eid)
            await counters.add("started", token=eid)
            await store.create(eid, profile="generic", template="chatml", policy_version=0)
            await credentials.issue(eid)
            tree = TrajectoryTree(eid, template_for_family("chatml"), get_profile("generic"))
            await _call(store, tree, eid, f"{i}+2", f"answer {i + 2}")
            await _call(store, tree, eid, f"{i}+3", f"answer {i + 3}")  # a second root-level branch
            await store.close(eid)
            await ownership.forget(eid, "COMPLETED")
            await counters.add("finished", token=eid)
            blobs[eid] = dict(await redis.hgetall(keys.tree_nodes(eid)))
        assert await queue.put(eid, b"{}")
        claim = await queue.claim("evaluator-0")
        assert claim is not None and await queue.ack(claim)
        status = "valid" if reward is not None else "placeholder"
        await evaluations.put(
            Evaluation(
                eid,
                status,
                reward or 0.0,
                f"/w/{eid}",
                f"h{i}" if reward is not None else "",
                attempts=1,
                detail="scored",
            )
        )
        await outcomes.resolve(group_id, len(eids), 0, MemberOutcome(eid, status, reward or 0.0))
    return Written(group_id, eids, blobs)


async def run_keys(redis: aioredis.Redis, keys: Keys) -> list[str]:
    return sorted([k.decode() async for k in redis.scan_iter(match=keys.pattern(), count=1000)])


async def mentions(redis: aioredis.Redis, keys: Keys, ids: list[str]) -> list[str]:
    """Keys of the run that name one of `ids`, or sets / hashes of the run that hold one of them."""
    found = []
    for key in await run_keys(redis, keys):
        kind = (await redis.type(key)).decode()
        members: list[bytes] = []
        if kind == "set":
            members = list(await redis.smembers(key))
        elif kind == "hash":
            members = list(await redis.hkeys(key))
        elif kind == "list":
            members = list(await redis.lrange(key, 0, -1))
        names = [key, *(m.decode(errors="replace") for m in members)]
        found += [f"{key} ({name})" for name in names for i in ids if i in name]
    return found


def packer_config(run_id: str, tmp_path: Path, nats: ServerProcess, redis: ServerProcess) -> object:
    return load_config(
        None,
        environ={},
        overrides={
            "run": {"id": run_id, "dir": str(tmp_path / "runs")},
            "nats": {"url": nats.url},
            "redis": {"url": redis.url},
            "metrics": {"serve": False},
            "scheduler": {"group_size": N, "batch_groups": 1, "phi": 0.0, "mu": 1},
            "log": {"format": "json", "level": "warning"},
        },
    )


async def _wait(path: Path, timeout_s: float = 20.0) -> None:
    await eventually(path.exists, timeout_s=timeout_s, interval_s=0.05, what=f"{path} to appear")


async def _step(packer: PackerService, bus: EventBus, redis: aioredis.Redis, keys: Keys, step: int) -> str:
    """Pack one batch of one group, train it as the core does (claim, ack) and commit the step."""
    progress = await packer.open_batch(step, num_groups=1, policy_version=step)
    await eventually(
        lambda: progress.closed, timeout_s=20, interval_s=0.05, what="the batch's stream to close"
    )
    queue = WorkQueue(redis, keys, microstep_queue(progress.batch_id))
    while (claim := await queue.claim("cell-0")) is not None:
        assert await queue.ack(claim)
    await bus.publish(
        ev.StepCompleted(batch_id=progress.batch_id, policy_version=step + 1, num_microsteps=1),
        event_id=f"step:{progress.batch_id}:{step + 1}",
    )
    return progress.batch_id


async def test_a_committed_step_leaves_redis_and_the_archive_reads_back_the_identical_tree(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
) -> None:
    assert QUEUE == EVALUATIONS_QUEUE  # the archiver trims the evaluator's own queue
    config = packer_config(run_id, tmp_path, nats_server, redis_server)
    first = await leave_group(redis, keys, "g00001", [1.0, None])
    before = {
        eid: await TreeStore(redis, keys).load(eid, template_for_family("chatml")) for eid in first.blobs
    }
    archive = tmp_path / "runs" / run_id / "archive"
    async with PackerService(config) as packer:  # type: ignore[arg-type]
        batch0 = await _step(packer, bus, redis, keys, 0)
        await _wait(batch_path(archive, batch0))
        assert await mentions(redis, keys, [first.group_id]) == []
        # The step record of the last committed step stays for the cells; the next step's commit takes it.
        assert any(microstep_queue(batch0) in k for k in await run_keys(redis, keys))
        second = await leave_group(redis, keys, "g00002", [0.0, 1.0])
        batch1 = await _step(packer, bus, redis, keys, 1)
        await _wait(batch_path(archive, batch1))
        assert await mentions(redis, keys, [second.group_id]) == []
        # Of batch 0's queue only the stored micro-steps stay: a core restarting behind its checkpoint
        # replays the step from them, and the core's next checkpoint drops them (no core runs here).
        stored = {keys.queue(microstep_queue(batch0), part) for part in REPLAY_PARTS}
        assert {k for k in await run_keys(redis, keys) if microstep_queue(batch0) in k} <= stored
        left = [k for k in await run_keys(redis, keys) if k not in stored]
    # What is left is run-wide, not per group: counter values, the dispatch sequence, the last step record.
    assert all(
        ("counters" in k and k.endswith("values"))
        or microstep_queue(batch1) in k
        or "queue:{evaluations}" in k
        for k in left
    ), left

    trees = archived_trees(tmp_path / "runs" / run_id)
    assert sorted(trees) == sorted([*first.blobs, *second.blobs])
    for eid, tree in before.items():
        archived = read_archived_tree(trees[eid])
        assert {
            str(n).encode(): b for n, b in zip(sorted(tree.nodes), archived.blobs, strict=True)
        } == first.blobs[eid]
        loaded = load_archived_tree(trees[eid], template_for_family("chatml"))
        assert loaded.closed and sorted(loaded.nodes) == sorted(tree.nodes)
        for node_id, node in tree.nodes.items():
            other = loaded.nodes[node_id]
            assert other.token_ids.tolist() == node.token_ids.tolist()
            assert other.logprobs.tolist() == node.logprobs.tolist()
            assert (other.parent.node_id if other.parent else 0) == (
                node.parent.node_id if node.parent else 0
            )
        assert [a.num_targets for a in admit(loaded, j_max=5, seed=3)] == [
            a.num_targets for a in admit(tree, j_max=5, seed=3)
        ]

    group = load_archived_group(tmp_path / "runs" / run_id, first.group_id)
    assert group["batch_id"] == batch0 and group["trained_version"] == 1
    assert group["record"]["execution_ids"] == first.execution_ids
    assert group["outcome"]["members"] == {
        "g00001-e00": {"status": "valid", "reward": 1.0, "workspace_hash": ""},
        "g00001-e01": {"status": "placeholder", "reward": 0.0, "workspace_hash": ""},
    }
    assert [e["workspace_hash"] for e in group["evaluations"]["g00001-e00"]] == ["h0"]
    assert group["trees"] == {"g00001-e00": "trees/g00001-e00.tree.gz", "g00001-e01": None}
    ledger = [
        (b["step"], b["groups"], b["trained_version"]) for b in archived_batches(tmp_path / "runs" / run_id)
    ]
    assert ledger == [(0, ["g00001"], 1), (1, ["g00002"], 2)]

    out = CliRunner().invoke(app, ["trace", "replay", str(tmp_path / "runs" / run_id)])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["num_trees"] == 3 and summary["totals"]["requests"] == 6


async def test_a_crash_between_archive_and_delete_and_a_redelivery_lose_and_duplicate_nothing(
    redis: aioredis.Redis, keys: Keys, run_id: str, tmp_path: Path
) -> None:
    written = await leave_group(redis, keys, "g00007", [0.5, 1.0])
    outcomes = GroupOutcomes(redis, keys)
    batch = batch_id(run_id, 4)
    assert [g.group_id for g in await outcomes.claim_ready(1, batch)] == ["g00007"]
    archiver = StepArchiver(redis, keys, tmp_path / "archive")
    present = await run_keys(redis, keys)

    # Crash after the files were written, before any delete: Redis still holds everything.
    await archiver._archive_group("g00007", batch, 4, 5)
    files = {p: p.read_bytes() for p in (tmp_path / "archive").rglob("*.gz")}
    assert len(files) == 3 and await run_keys(redis, keys) == present
    # Crash in the middle of the deletes: part of the group is gone from Redis already.
    await redis.delete(*outcomes.group_keys("g00007"), keys.tree_nodes(written.execution_ids[0]))

    done = await archiver.archive_step(batch, policy_version=5)
    assert done.num_groups == 1 and done.num_trees == 0  # the files were complete: nothing rewritten
    assert {p: p.read_bytes() for p in files} == files
    assert await mentions(redis, keys, ["g00007"]) == []
    again = await archiver.archive_step(batch, policy_version=5)  # a redelivered StepCompleted
    assert again.num_trees == 0 and again.bytes_written == 0 and again.num_keys_deleted == 0
    for eid in written.execution_ids:
        archived = read_archived_tree(tree_path(tmp_path / "archive", eid))
        assert sorted(archived.blobs) == sorted(written.blobs[eid].values())
    assert (
        load_archived_group(tmp_path / "archive", "g00007")["outcome"]["members"]["g00007-e01"]["reward"]
        == 1.0
    )
    assert group_path(tmp_path / "archive", "g00007").exists()


async def test_archiving_off_keeps_the_group_in_redis(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
) -> None:
    config = packer_config(run_id, tmp_path, nats_server, redis_server)
    config.archive.enabled = False  # type: ignore[attr-defined]
    await leave_group(redis, keys, "g00001", [1.0, 0.0])
    async with PackerService(config) as packer:  # type: ignore[arg-type]
        await _step(packer, bus, redis, keys, 0)
        await asyncio.sleep(1.0)  # scenario: the time an enabled archiver would have taken to act
        assert len(await mentions(redis, keys, ["g00001"])) > 10
    assert not (tmp_path / "runs" / run_id / "archive").exists()
