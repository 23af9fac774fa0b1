"""A finished run's primary data, read back for the audit: what each service wrote as it worked, not
what it reported about itself.

    data = RunData.load(Path("runs/demo-…"))

- the resolved config (`config.yaml`), the run's report (`summary.json`, `events.jsonl`) and the trainer's
  per-step metrics (`metrics.jsonl`: the clip and mask fractions and the mismatch it logged) for comparison;
- the archive (gyre/store/archive.py, gyre/store/step_archive.py): each trained batch's groups and the
  group files (dispatch record, execution records, evaluations, the evaluator's member outcomes, the
  runner's claims), each member's trajectory tree (`archive/trees/`, read when asked: `RunData.tree`),
  and each optimizer step's micro-steps with the weights after it;
- the run's Redis as the run left it (the AOF under `runs/<run>/redis`, loaded into a redis-server of the
  audit's own on a copy, so the run's data is never touched): the scheduler's counters d/p/f and its
  persisted state (whether the run was stopping), and for every group not archived its dispatch record,
  execution records, runner claims, evaluations, outcomes and trajectory trees; and the groups each batch
  claimed, for a step the core recorded whose batch the packer had not archived yet when the run stopped
  (the packer archives a batch after its step committed).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from gyre.config import ConfigError, GyreConfig, load_config
from gyre.metrics.sinks.jsonl import JSONL_NAME
from gyre.store.archive import archived_batches, read_json_gz
from gyre.store.keys import Keys
from gyre.store.step_archive import StepRecordFile, read_step_records
from gyre.trajectory.archive import ArchivedTree, archive_dir_of, read_archived_tree, tree_path
from gyre.trajectory.tree import TrajectoryTree


class AuditInputError(ValueError):
    """The directory is not a finished run the audit can read (a one-line message naming what is missing)."""


@dataclass(slots=True)
class GroupData:
    """One dispatched group, from its dispatch record and what the runner and the evaluator recorded."""

    group_id: str
    policy_version: int
    """v_d: the policy version it was dispatched under (the scheduler's dispatch record)."""
    execution_ids: list[str]
    runner: dict[str, str | None] = field(default_factory=dict)
    """Execution → the runner's claim: None (never claimed), "<runner>" (claimed, not finished) or
    "done:<runner>:<REASON>" (terminated; older runs: "done:<runner>")."""
    evaluations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Execution → the evaluator's stored evaluations, oldest first."""
    outcome: dict[str, str] = field(default_factory=dict)
    """Execution → the member status the evaluator resolved into the group (valid/excluded/placeholder)."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Execution → the reward the evaluator resolved into the group (what the packer read)."""
    trees: dict[str, bool] = field(default_factory=dict)
    """Execution → whether the run stored a trajectory tree for it (False: the harness never opened one)."""
    records: set[str] = field(default_factory=set)
    """Executions whose dispatch record exists."""
    archived_batch: str | None = None
    """The batch the group file says trained it (None: not archived)."""
    archived_version: int | None = None


@dataclass(slots=True)
class RunData:
    run_dir: Path
    config: GyreConfig
    archive_dir: Path
    batches: list[dict[str, Any]]
    groups: dict[str, GroupData]
    steps: list[StepRecordFile]
    counters: dict[str, int]
    scheduler_state: dict[str, Any] | None
    summary: dict[str, Any] | None
    events: list[dict[str, Any]] | None
    step_metrics: dict[int, dict[str, Any]] | None = None
    """Step → its row of `metrics.jsonl` (None: the run has no such file)."""
    redis_trees: dict[str, ArchivedTree] = field(default_factory=dict)
    """The trees of the groups still in Redis (the archived ones are read from `archive/trees/`)."""

    @classmethod
    def load(cls, run_dir: Path, *, redis_data: bool = True, redis_url: str | None = None) -> RunData:
        run_dir = Path(run_dir)
        config_path = run_dir / "config.yaml"
        if not config_path.is_file():
            raise AuditInputError(f"{run_dir}: not a run directory (no config.yaml)")
        if (run_dir / "stack.json").is_file() and _live(run_dir):
            raise AuditInputError(f"{run_dir}: the run is still up; `gyre down --run {run_dir.name}` first")
        try:
            config = load_config(config_path, environ={})
        except ConfigError as e:
            raise AuditInputError(f"the run's config does not load: {e}") from None
        archive_dir = config.archive.path_for(run_dir)
        if not archive_dir.is_dir():
            archive_dir = archive_dir_of(run_dir)
        try:
            batches = archived_batches(archive_dir)
            steps = read_step_records(archive_dir)
        except ValueError as e:
            raise AuditInputError(str(e)) from None
        groups: dict[str, GroupData] = {}
        counters: dict[str, int] = {}
        scheduler_state: dict[str, Any] | None = None
        claimed: dict[str, list[str]] = {}
        trees: dict[str, ArchivedTree] = {}
        if redis_data:
            counters, scheduler_state = _read_redis(
                run_dir, Keys(config.run.id), groups, claimed, trees, redis_url
            )
        _read_archived_groups(archive_dir, groups)
        archived = {str(b["batch_id"]) for b in batches}
        for record in steps:  # a step taken and recorded whose batch was not archived before the run stopped
            if record.batch_id not in archived and record.batch_id in claimed:
                batches.append(
                    {
                        "batch_id": record.batch_id,
                        "step": record.step,
                        "trained_version": record.version,
                        "groups": sorted(claimed[record.batch_id]),
                        "source": "redis",
                    }
                )
        batches.sort(key=lambda b: int(b["step"]))
        summary_path, events_path = run_dir / "summary.json", run_dir / "events.jsonl"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
        events = (
            [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()]
            if events_path.is_file()
            else None
        )
        metrics_path = run_dir / JSONL_NAME
        step_metrics = (
            {
                int(r["step"]): r
                for r in (json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip())
            }
            if metrics_path.is_file()
            else None
        )
        return cls(
            run_dir=run_dir,
            config=config,
            archive_dir=archive_dir,
            batches=batches,
            groups=dict(sorted(groups.items())),
            steps=steps,
            counters=counters,
            scheduler_state=scheduler_state,
            summary=summary,
            events=events,
            step_metrics=step_metrics,
            redis_trees=trees,
        )

    def tree(self, execution_id: str) -> TrajectoryTree | None:
        """The execution's recorded trajectory tree (read-only), from the archive or the run's Redis; None
        when neither holds one. A ValueError when the archived file is not a tree archive."""
        path = tree_path(self.archive_dir, execution_id)
        if path.is_file():
            return read_archived_tree(path).tree()
        stored = self.redis_trees.get(execution_id)
        return stored.tree() if stored is not None else None


def _live(run_dir: Path) -> bool:
    from app.stack.state import StackState

    state = StackState.load(run_dir)
    return state is not None and state.live()


def _read_archived_groups(archive_dir: Path, groups: dict[str, GroupData]) -> None:
    folder = archive_dir / "groups"
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.json.gz")):
        try:
            d = read_json_gz(path)
        except ValueError as e:
            raise AuditInputError(str(e)) from None
        record = d.get("record") or {}
        gid = str(d["group_id"])
        executions = d.get("executions") or {}
        g = groups.get(gid) or GroupData(
            gid, int(record.get("policy_version", -1)), list(record.get("execution_ids") or executions)
        )
        if record:
            g.policy_version, g.execution_ids = int(record["policy_version"]), list(record["execution_ids"])
        g.records |= {e for e, r in executions.items() if r is not None}
        for eid, claim in (d.get("runner") or {}).items():
            g.runner[eid] = claim if claim is not None else g.runner.get(eid)
        for eid, evs in (d.get("evaluations") or {}).items():
            g.evaluations[eid] = list(evs) or g.evaluations.get(eid, [])
        outcome = d.get("outcome") or {}
        for eid, member in (outcome.get("members") or {}).items():
            g.outcome[eid] = str(member["status"])
            g.rewards[eid] = float(member.get("reward", 0.0))
        for eid, tree in (d.get("trees") or {}).items():
            g.trees[eid] = tree is not None
        g.archived_batch = str(d["batch_id"])
        g.archived_version = int(d["trained_version"])
        groups[gid] = g


def _glob(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _s(raw: bytes | str | None) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


def _read_redis(
    run_dir: Path,
    keys: Keys,
    groups: dict[str, GroupData],
    claimed: dict[str, list[str]],
    trees: dict[str, ArchivedTree],
    redis_url: str | None = None,
) -> tuple[dict[str, int], dict[str, Any] | None]:
    """Counters and scheduler state, and every group still in Redis: from the server at `redis_url`, else
    from a copy of the run's AOF loaded into a redis-server of the audit's own."""
    from app.stack.servers import start_redis

    if redis_url is not None:
        return _read_from(redis_url, keys, groups, claimed, trees)
    data = run_dir / "redis"
    if not data.is_dir():
        raise AuditInputError(
            f"{run_dir}: no Redis data (redis/): the accounting reads the run's own records"
        )
    with tempfile.TemporaryDirectory(prefix="gyre-audit-redis-") as tmp:
        copy = Path(tmp) / "redis"
        shutil.copytree(data, copy, ignore=shutil.ignore_patterns("*.log", "*.sock"))
        server = start_redis(copy, appendonly=True)
        try:
            return _read_from(server.url, keys, groups, claimed, trees, loaded_from=data)
        finally:
            server.stop()


def _read_from(
    url: str,
    keys: Keys,
    groups: dict[str, GroupData],
    claimed: dict[str, list[str]],
    trees: dict[str, ArchivedTree],
    loaded_from: Path | None = None,
) -> tuple[dict[str, int], dict[str, Any] | None]:
    """The run's records from the server at `url`; `loaded_from`: the data directory it loaded (checked)."""
    client = redis.Redis.from_url(url)
    try:
        if loaded_from is not None:
            _check_readable(client, loaded_from)
        return _read_keys(client, keys, groups, claimed, trees)
    finally:
        client.close()


def _check_readable(client: redis.Redis, data: Path) -> None:
    """Redis 7 keeps its AOF as a directory of parts (`appendonlydir/`), which an older redis-server does
    not read: it starts empty, and every count would silently be zero. Refuse that instead."""
    if not (data / "appendonlydir").is_dir():
        return
    version = str(client.info("server")["redis_version"])
    if int(version.split(".")[0]) < 7:
        raise AuditInputError(
            f"{data}: the run's Redis wrote a Redis 7 multi-part AOF (appendonlydir/), which this "
            f"redis-server {version} cannot load; put a Redis 7 redis-server on PATH, or serve the data with "
            "the run's own Redis and pass its URL"
        )


def _read_keys(
    r: redis.Redis,
    keys: Keys,
    groups: dict[str, GroupData],
    claimed: dict[str, list[str]],
    trees: dict[str, ArchivedTree],
) -> tuple[dict[str, int], dict[str, Any] | None]:
    raw = r.hmget(keys.counters(), ["d", "p", "f"])
    counters = {k: int(v) if v is not None else 0 for k, v in zip(("d", "p", "f"), raw, strict=True)}
    state_raw = r.get(keys.scheduler_state())
    state = json.loads(state_raw) if state_raw is not None else None
    ready = keys.ready_groups().removesuffix("zset")  # the group outcomes' keys (gyre/store/groups.py)
    for key in r.scan_iter(match=_glob(ready + "batch:") + "*", count=1000):
        batch = str(_s(key)).removeprefix(ready + "batch:")
        claimed[batch] = sorted(str(_s(g)) for g in r.smembers(key))
    prefix = f"gyre:{keys.run_id}:group:{{"
    for key in r.scan_iter(match=f"{prefix}*}}:record", count=1000):
        record = json.loads(r.get(key) or b"null")
        if record is None:
            continue
        gid = str(record["group_id"])
        g = GroupData(gid, int(record["policy_version"]), list(record["execution_ids"]))
        for eid in g.execution_ids:
            if r.exists(keys.execution(eid)):
                g.records.add(eid)
            g.runner[eid] = _s(r.get(keys.execution_runner(eid)))
            g.evaluations[eid] = [json.loads(e) for e in r.lrange(keys.evaluations(eid), 0, -1)]
            tree = _read_tree(r, keys, eid)
            g.trees[eid] = tree is not None
            if tree is not None:
                trees[eid] = tree
        members = r.hgetall(ready + f"members:{gid}")
        for key, outcome in members.items():
            member = json.loads(outcome)
            g.outcome[str(_s(key))] = str(member["status"])
            g.rewards[str(_s(key))] = float(member.get("reward", 0.0))
        groups[gid] = g
    return counters, state


def _read_tree(r: redis.Redis, keys: Keys, execution_id: str) -> ArchivedTree | None:
    """The tree store's copy of an execution's tree (gyre/store/trees.py), as an archive file holds it."""
    meta = {str(_s(k)): str(_s(v)) for k, v in r.hgetall(keys.tree_meta(execution_id)).items()}
    if not meta:
        return None
    nodes = r.hgetall(keys.tree_nodes(execution_id))
    blobs = sorted(
        (int(str(_s(k))), v if isinstance(v, bytes) else str(v).encode()) for k, v in nodes.items()
    )
    return ArchivedTree(execution_id, meta, [blob for _, blob in blobs])
