"""A harness that fills its container's workspace past the runner's copy-out caps (issue 38, "the policy
is an adversary"), with real NATS, Redis and containers from the local engine: its execution ends FAILED
with one line naming the cap and the counts, nothing of its workspace is left on the host, and it is
accounted like any other (one ExecutionTerminated, a placeholder evaluation, its container gone); the
other member of its group is copied out and evaluated as usual."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre.bus import EventBus
from gyre.paths import REPO_ROOT
from gyre.store import Keys
from gyre.tasks import TaskSet
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.evaluator.service import EvaluatorService
from services.runner.service import RunnerService
from services.scheduler.dispatch import Dispatcher, QuerySource
from tests.support.containers import containers_of, engine_client
from tests.support.proxy_stub import ProxyStub
from tests.support.runner_env import EventLog, run_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("container_session")]

EXAMPLE = REPO_ROOT / "examples" / "tasks" / "fix-sum"
#: Member 0 writes 200 small files into its workspace (/app); member 1 leaves it as it is.
FLOOD = [
    "bash",
    "-c",
    "case {execution_id} in *-e00) mkdir flood && for i in $(seq 200); do echo $i > flood/$i; done;; esac; true",
]


@pytest.fixture
async def proxy() -> AsyncIterator[ProxyStub]:
    async with ProxyStub("http://127.0.0.1:9") as stub:  # the command harness calls no model
        yield stub


async def test_a_workspace_past_the_file_cap_fails_its_execution(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "tasks" / "fix-sum")
    box = {"kill_grace_s": 1.0, "isolation": "container"}
    config = run_config(
        run_id,
        tmp_path / "runs",
        nats_server.url,
        redis_server.url,
        proxy.port,
        tasks={"dirs": [str(tmp_path / "tasks")]},
        runner={
            "harness": "command",
            "command": FLOOD,
            "max_concurrent": 2,
            # fix-sum's /app holds a handful of entries: 100 leaves room for them, not for the flood.
            "sandbox": {**box, "uid_base": 198000, "copy_out_max_files": 100},
        },
        evaluator={"backoff_s": 0.2, "max_concurrent": 2, "sandbox": {**box, "uid_base": 199000}},
    )
    queries = QuerySource(TaskSet.from_section(config.tasks), seed=0)
    dispatcher = Dispatcher(redis, keys, bus, "generic", queries, group_size=2)
    events = await EventLog.attach(bus)
    async with RunnerService(config), EvaluatorService(config):
        await dispatcher.dispatch(num_groups=1, group_size=2, policy_version=0, burst=0)
        await dispatcher.start("cell-0", 2)
        (ready,) = await events.wait_for(ev.GroupReady, timeout_s=120)
    terminated = events.of(ev.ExecutionTerminated)
    assert len(terminated) == 2, terminated  # exactly one each
    terms = {e.execution.execution_id[-3:]: e for e in terminated}
    done = {e.execution.execution_id[-3:]: e for e in events.of(ev.EvaluationDone)}

    flooded = terms["e00"]
    assert flooded.reason == cm.TERMINATION_REASON_FAILED, flooded
    assert flooded.detail.startswith(
        "copy-out over its file cap: more than 100 files (runner.sandbox.copy_out_max_files); "
        "stopped after 100 files, "
    ), flooded.detail
    assert flooded.workspace.path == ""
    workspaces = list((tmp_path / "runs").rglob(f"*{flooded.execution.execution_id}*"))
    assert not [p for p in workspaces if p.is_dir() and (p / "flood").exists()], workspaces
    assert done["e00"].status == cm.EVALUATION_STATUS_PLACEHOLDER
    assert "file cap" in done["e00"].detail

    assert terms["e01"].reason == cm.TERMINATION_REASON_COMPLETED
    assert done["e01"].status == cm.EVALUATION_STATUS_VALID, done["e01"]
    assert Path(terms["e01"].workspace.path, "sum.sh").is_file()
    assert ready.num_valid == 1
    assert containers_of(engine_client(), **{"gyre.run": run_id}) == []
