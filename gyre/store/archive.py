"""Bounded state: a committed step's groups leave Redis, archived first as files in the run directory.

Once the optimizer step that consumed a batch has committed (`StepCompleted`), nothing of the run reads
that batch's groups from Redis again; the packer then calls

    archiver = StepArchiver(redis, keys, archive_dir)
    summary = await archiver.archive_step(batch_id, policy_version=v, completed=event_dict)

which, for every group the batch claimed (trained, or packed with every member excluded), writes

    <archive>/trees/<execution>.tree.gz    each member's trajectory tree (gyre/trajectory/archive.py)
    <archive>/groups/<group>.json.gz       the group record, its execution records, outcomes, evaluations
                                           and runner claims (how the runner says each one ended)
    <archive>/batches/<batch>.json.gz      last: the batch's group ids and its StepCompleted, once all are gone

and then deletes the group's keys: execution and group records, runner claims, evaluations, outcomes,
trees, the proxy's keys of its executions, and the group's ids in the counters' dedup sets and the
evaluator queue's id sets. When the batch is done, its claim set goes, and so does the step record (the
micro-step queue and join window) of the step before it, which no cell consults any more.

Crash and redelivery safety: a file is written atomically and fsynced before anything it holds is
deleted, and an existing file is never rewritten (it is complete); deletes are idempotent. A crash at
any point leaves either the Redis copy, or the file, or both; calling `archive_step` again (the durable
consumer redelivers the event) finishes the job. Dedup ids are dropped only for trained groups, whose
start, termination and evaluation events were all acknowledged long before their step could commit.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from gyre.durable import write_durable
from gyre.ids import EVALUATIONS_QUEUE, batch_id, microstep_queue, step_of_batch
from gyre.store.counters import Counters
from gyre.store.groups import GroupOutcomes
from gyre.store.keys import Keys
from gyre.store.workqueue import WorkQueue
from gyre.trajectory.archive import archive_dir_of, tree_path, write_archived_tree

GROUP_FORMAT = "gyre-group-archive/1"
BATCH_FORMAT = "gyre-batch-archive/1"

REPLAY_PARTS = ("payloads", "known")
"""Parts of a micro-step queue a restarted core replays a step from (kept until a checkpoint covers it)."""


def group_path(archive_dir: Path, group_id: str) -> Path:
    return Path(archive_dir) / "groups" / f"{group_id}.json.gz"


def batch_path(archive_dir: Path, batch_id_: str) -> Path:
    return Path(archive_dir) / "batches" / f"{batch_id_}.json.gz"


def read_json_gz(path: Path) -> dict[str, Any]:
    """A group or batch archive file; a ValueError names the file when it is not one."""
    try:
        data = json.loads(gzip.decompress(Path(path).read_bytes()))
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: not a gzip JSON archive ({e})") from None
    if not isinstance(data, dict) or data.get("format") not in (GROUP_FORMAT, BATCH_FORMAT):
        raise ValueError(f"{path}: not a Gyre group or batch archive")
    return data


def load_archived_group(directory: Path, group_id: str) -> dict[str, Any]:
    """The archived group (`record`, `executions`, `outcome`, `evaluations`, `trees`, `batch_id`,
    `trained_version`) of a run directory or an archive directory."""
    return read_json_gz(group_path(archive_dir_of(directory), group_id))


def archived_batches(directory: Path) -> list[dict[str, Any]]:
    """Every archived batch of a run (or archive) directory, in step order: the group → policy version
    ledger of a finished run (`groups`, `step`, `trained_version`)."""
    found = sorted((archive_dir_of(directory) / "batches").glob("*.json.gz"))
    return sorted((read_json_gz(p) for p in found), key=lambda b: int(b["step"]))


@dataclass(frozen=True, slots=True)
class ArchivedStep:
    """What one `archive_step` call did."""

    batch_id: str
    num_groups: int
    num_trees: int
    """Trees written by this call (0 when an earlier delivery had written them)."""
    num_keys_deleted: int
    bytes_written: int


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


class StepArchiver:
    def __init__(
        self, redis: aioredis.Redis, keys: Keys, archive_dir: Path, *, compress_level: int = 6
    ) -> None:
        self._redis = redis
        self._keys = keys
        self.archive_dir = Path(archive_dir)
        self.compress_level = compress_level
        self._outcomes = GroupOutcomes(redis, keys)
        self._counters = Counters(redis, keys)
        self._evaluations = WorkQueue(redis, keys, EVALUATIONS_QUEUE)

    async def archive_step(
        self, batch_id_: str, *, policy_version: int, completed: Mapping[str, Any] | None = None
    ) -> ArchivedStep:
        """Archive and delete the groups of a committed batch (idempotent; see the module docstring)."""
        step = step_of_batch(batch_id_)
        marker = batch_path(self.archive_dir, batch_id_)
        groups = await self._outcomes.claimed_ids(batch_id_)
        if marker.exists():  # an earlier delivery got this far: only its last deletes may be left
            groups = [str(g) for g in (await asyncio.to_thread(read_json_gz, marker))["groups"]]
        num_trees = num_deleted = written = 0
        for group_id in groups:
            execution_ids, trees, size = await self._archive_group(group_id, batch_id_, step, policy_version)
            num_trees, written = num_trees + trees, written + size
            num_deleted += await self._delete_group(group_id, execution_ids)
        if not marker.exists():
            written += await self._write(
                marker,
                {
                    "format": BATCH_FORMAT,
                    "batch_id": batch_id_,
                    "step": step,
                    "trained_version": policy_version,
                    "groups": groups,
                    "step_completed": dict(completed or {}),
                    "archived_at_s": time.time(),
                },
            )
        # The batch's claimed groups and the packer's record of it (kept to resume an open batch; its
        # stream closed before its step could commit).
        num_deleted += int(
            await self._redis.delete(self._outcomes.batch_key(batch_id_), self._keys.batch(batch_id_))
        )
        if step > 0:
            num_deleted += await self._delete_step_record(batch_id(self._keys.run_id, step - 1))
        return ArchivedStep(batch_id_, len(groups), num_trees, num_deleted, written)

    # -- one group ---------------------------------------------------------------------------------
    async def _archive_group(
        self, group_id: str, batch_id_: str, step: int, version: int
    ) -> tuple[list[str], int, int]:
        """Write the group's trees, then its group file, unless that file exists (then every tree
        exists too); returns the group's execution ids, the trees written and the bytes written."""
        path = group_path(self.archive_dir, group_id)
        if path.exists():
            return list((await asyncio.to_thread(read_json_gz, path))["trees"]), 0, 0
        r, k = self._redis, self._keys
        record_raw = await r.get(k.group(group_id))
        record = json.loads(record_raw) if record_raw is not None else None
        outcome = await self._outcomes.get(group_id)
        members = {m.execution_id: m for m in outcome.members} if outcome is not None else {}
        execution_ids = list(record["execution_ids"]) if record is not None else sorted(members)
        executions: dict[str, Any] = {}
        runner: dict[str, str | None] = {}
        evaluations: dict[str, list[Any]] = {}
        trees: dict[str, str | None] = {}
        num_trees = written = 0
        for eid in execution_ids:
            raw = await r.get(k.execution(eid))
            executions[eid] = json.loads(raw) if raw is not None else None
            claim = await r.get(k.execution_runner(eid))
            runner[eid] = _text(claim) if claim is not None else None
            evaluations[eid] = [json.loads(e) for e in await r.lrange(k.evaluations(eid), 0, -1)]
            meta = {_text(a): _text(b) for a, b in (await r.hgetall(k.tree_meta(eid))).items()}
            if not meta:
                trees[eid] = None  # the harness never opened a tree (never started, or never called)
                continue
            blobs = {
                int(_text(a)): b if isinstance(b, bytes) else b.encode()
                for a, b in (await r.hgetall(k.tree_nodes(eid))).items()
            }
            target = tree_path(self.archive_dir, eid)
            trees[eid] = str(target.relative_to(self.archive_dir))
            if not target.exists():
                await asyncio.to_thread(write_archived_tree, target, eid, meta, blobs, self.compress_level)
                num_trees += 1
                written += target.stat().st_size
        document = {
            "format": GROUP_FORMAT,
            "group_id": group_id,
            "batch_id": batch_id_,
            "step": step,
            "trained_version": version,
            "record": record,
            "executions": executions,
            "outcome": None
            if outcome is None
            else {
                "policy_version": outcome.policy_version,
                "ready_time_s": outcome.ready_time_s,
                "state": outcome.state,
                "batch_id": outcome.batch_id,
                "members": {
                    eid: {"status": m.status, "reward": m.reward, "workspace_hash": m.workspace_hash}
                    for eid, m in members.items()
                },
            },
            "evaluations": evaluations,
            "runner": runner,
            "trees": trees,
            "archived_at_s": time.time(),
        }
        written += await self._write(path, document)
        return execution_ids, num_trees, written

    async def _delete_group(self, group_id: str, execution_ids: list[str]) -> int:
        """Delete every Redis key of an archived group (its file exists); returns the keys deleted."""
        k = self._keys
        digests = [
            _text(d) for eid in execution_ids for d in await self._redis.smembers(k.proxy_keys_of(eid))
        ]
        async with self._redis.pipeline(transaction=False) as pipe:
            # Keys found through another key go first: the proxy keys before the index that lists them.
            for digest in digests:
                pipe.delete(k.proxy_key(digest))
            for eid in execution_ids:
                pipe.delete(*k.execution_keys(eid))
            pipe.delete(k.group(group_id), *self._outcomes.group_keys(group_id))
            pipe.srem(self._counters.seen_key("dispatched"), group_id)
            if execution_ids:
                pipe.srem(self._counters.seen_key("started"), *execution_ids)
                pipe.srem(self._counters.seen_key("finished"), *execution_ids)
            results = await pipe.execute()
        await self._evaluations.forget(execution_ids)
        return sum(int(n) for n in results[: len(digests) + len(execution_ids) + 1])

    async def _delete_step_record(self, batch_id_: str) -> int:
        """Delete the micro-step queue and join window of a batch whose next step committed too, except
        the stored micro-steps (`payloads`, `known`): a core that restarts behind its checkpoint replays
        the step from them, and the core drops them once a checkpoint covers the step
        (services/cell_agent/replay.py)."""
        prefix = self._keys.queue(microstep_queue(batch_id_), "")
        kept = {(prefix + part).encode() for part in REPLAY_PARTS}
        found = [key async for key in self._redis.scan_iter(match=_glob_escape(prefix) + "*", count=1000)]
        found = [key for key in found if (key if isinstance(key, bytes) else str(key).encode()) not in kept]
        return int(await self._redis.delete(*found)) if found else 0

    async def _write(self, path: Path, document: Mapping[str, Any]) -> int:
        data = gzip.compress(json.dumps(document, sort_keys=True).encode(), self.compress_level, mtime=0)
        wrote = await asyncio.to_thread(write_durable, path, data)
        return len(data) if wrote else 0
