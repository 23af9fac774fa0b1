"""One `tasks:` section, read by the scheduler, the runner and the evaluator alike: the scheduler's
dispatcher draws an on-disk task.yaml set and a Harbor set, the runner runs them in sandboxes (the
Harbor workspace at its WORKDIR, /app), the evaluator scores them (the Harbor reward from the task's
tests/test.sh). Real NATS, Redis and sandboxes; the harness is a shell command."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess, free_port
from gyre.bus import EventBus
from gyre.store import Keys, Records
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.evaluator.service import EvaluatorService
from services.runner.service import RunnerService
from services.scheduler.service import SchedulerService
from tests.support.proxy_stub import ProxyStub
from tests.support.runner_env import EventLog, run_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tasks" / "fix-add"
#: A stand-in agent: records where it ran; fixes the bug in the first member of a Harbor group only;
#: answers the task.yaml task.
HARNESS = [
    "bash",
    "-c",
    "pwd > where.txt; if [ -f calc.py ]; then case {execution_id} in "
    "*-e00) sed -i 's/return a - b/return a + b/' calc.py;; esac; else echo ok > out.txt; fi",
]


@pytest.fixture
async def proxy() -> AsyncIterator[ProxyStub]:
    async with ProxyStub("http://127.0.0.1:9") as stub:  # the command harness calls no model
        yield stub


def task_dirs(tmp_path: Path) -> tuple[Path, Path]:
    mine = tmp_path / "mine"
    (mine / "echo").mkdir(parents=True)
    (mine / "echo" / "task.yaml").write_text(
        'prompt: "Write ok to out.txt."\nverifier: ["{python}", "-m", "gyre.tasks.builtin.verify", "out.txt=ok"]\n'
        "harness_timeout_s: 60\noverall_budget_s: 120\n"
    )
    harbor = tmp_path / "harbor"
    shutil.copytree(EXAMPLE, harbor / "fix-add")
    return mine, harbor


def configure(
    run_id: str,
    tmp_path: Path,
    nats: ServerProcess,
    redis: ServerProcess,
    proxy: ProxyStub,
    tasks: dict[str, Any],
    isolation: str,
) -> Any:
    # Sandbox uids of their own: a sandbox launcher kills every process of a uid it takes, so tests
    # that share the machine must not share uids.
    box = {"kill_grace_s": 1.0, "isolation": isolation}
    return run_config(
        run_id,
        tmp_path / "runs",
        nats.url,
        redis.url,
        proxy.port,
        tasks=tasks,
        scheduler={"num_cells": 1, "group_size": 2, "batch_groups": 1, "phi": 0.0, "mu": 1},
        cell_agent={"ports": [free_port()], "engine_ports": [free_port()]},
        runner={
            "harness": "command",
            "command": HARNESS,
            "max_concurrent": 4,
            "sandbox": {**box, "uid_base": 181000},
        },
        evaluator={"backoff_s": 0.2, "max_concurrent": 2, "sandbox": {**box, "uid_base": 182000}},
    )


#: `auto` is `isolated` as root (Harbor's paths bind-mounted), `process` rewrites them.
@pytest.mark.parametrize("isolation", ["auto", "process"])
async def test_scheduler_dispatches_an_on_disk_set_and_a_harbor_set_from_one_section(
    isolation: str,
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    mine, harbor = task_dirs(tmp_path)
    config = configure(
        run_id, tmp_path, nats_server, redis_server, proxy, {"dirs": [str(mine), str(harbor)]}, isolation
    )
    events = await EventLog.attach(bus)
    # No cell agents run here, so the policy never starts the run; the test drives the scheduler's own
    # dispatcher (what its executor calls for DispatchGroups and StartExecutions) on the live service.
    async with SchedulerService(config) as scheduler, RunnerService(config), EvaluatorService(config):
        group_ids = await scheduler.dispatcher.dispatch(num_groups=4, group_size=2, policy_version=0, burst=0)
        assert len(await scheduler.dispatcher.start("cell-0", 8)) == 8
        ready = await events.wait_for(ev.GroupReady, 4, timeout_s=120)
    dispatched = {e.group_id: e.query_id for e in events.of(ev.GroupDispatched)}
    assert sorted(dispatched) == sorted(group_ids)
    assert sorted(dispatched.values()) == ["harbor/fix-add", "harbor/fix-add", "mine/echo", "mine/echo"]
    records = Records(redis, keys)
    for gid, task_id in dispatched.items():
        group = await records.get_group(gid)
        assert group is not None and group.task_id == task_id
    starts = {e.execution.execution_id: e for e in events.of(ev.ExecutionStartRequested)}
    harbor_starts = [s for s in starts.values() if s.task_id == "harbor/fix-add"]
    assert {(s.harness_timeout_s, s.overall_budget_s) for s in harbor_starts} == {
        (300.0, 420.0)
    }  # from task.toml

    terms = {e.execution.execution_id: e for e in events.of(ev.ExecutionTerminated)}
    assert {t.reason for t in terms.values()} == {cm.TERMINATION_REASON_COMPLETED}
    done = {e.execution.execution_id: e for e in events.of(ev.EvaluationDone)}
    rewards = {eid: (starts[eid].task_id, eid[-3:], d.status, d.reward) for eid, d in done.items()}
    valid = cm.EVALUATION_STATUS_VALID
    assert sorted(rewards.values()) == [
        ("harbor/fix-add", "e00", valid, 1.0),
        ("harbor/fix-add", "e00", valid, 1.0),  # test.sh passed
        ("harbor/fix-add", "e01", valid, 0.0),
        ("harbor/fix-add", "e01", valid, 0.0),  # the bug is still there
        ("mine/echo", "e00", valid, 1.0),
        ("mine/echo", "e00", valid, 1.0),
        ("mine/echo", "e01", valid, 1.0),
        ("mine/echo", "e01", valid, 1.0),
    ]
    assert all("reward.txt" in d.detail for eid, d in done.items() if starts[eid].task_id == "harbor/fix-add")
    by_group = {e.group_id: e.mean_reward for e in ready}
    assert sorted(by_group.values()) == [0.5, 0.5, 1.0, 1.0]
    # The Harbor harness ran in /app when the sandbox can mount it there (root), else in the workspace.
    mounted = isolation == "auto" and os.geteuid() == 0
    for eid in (s.execution.execution_id for s in harbor_starts):
        workspace = Path(terms[eid].workspace.path)
        where = (workspace / "where.txt").read_text().strip()
        assert where == ("/app" if mounted else str(workspace))
        assert (workspace / "test_calc.py").is_file() and not (workspace / "Dockerfile").exists()
