"""A runner with the container launcher killed with SIGKILL mid-execution and restarted: the containers
(and their proxy relays) outlive it, the restarted runner adopts them and the harnesses finish and are
scored in their containers; a container whose start the runner never recorded (it died between creating
it and writing its state) is reaped at the restart. At the end no container of the run is left."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre.bus import EventBus
from gyre.config import GyreConfig
from gyre.paths import REPO_ROOT
from gyre.sandbox import SandboxSpec
from gyre.sandbox.host import run_labels
from gyre.sandbox.launchers.base import LABEL_EXECUTION, LABEL_ROLE, LABEL_RUN
from gyre.store import Keys
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.evaluator.service import EvaluatorService
from services.runner.ownership import OwnedExecution, Ownership
from tests.support.containers import containers_of, engine_client
from tests.support.proxy_stub import ProxyStub
from tests.support.runner_env import EventLog, RunnerProcess, dispatch_group, run_config
from tests.support.sandboxes import launcher_for_test

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("container_session")]

GO = "/tmp/gyre-go"
#: Fixes sum.sh once the test creates GO in its container (after the runner was killed and restarted), so
#: the adopted harness's work is scored and it is still running whatever the machine's load.
HARNESS = [
    "bash",
    "-c",
    f"echo started > started.txt; until [ -e {GO} ]; do sleep 0.1; done; sed -i 's/\\$1 - \\$2/$1 + $2/' sum.sh",
]


@pytest.fixture
def runner_process() -> Iterator[list[RunnerProcess]]:
    started: list[RunnerProcess] = []
    yield started
    for runner in started:
        runner.stop()


async def test_a_sigkilled_runner_adopts_its_containers_and_reaps_an_unrecorded_one(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    runner_process: list[RunnerProcess],
) -> None:
    client = engine_client()
    shutil.copytree(REPO_ROOT / "examples" / "tasks" / "fix-sum", tmp_path / "tasks" / "fix-sum")
    box = {"kill_grace_s": 1.0, "isolation": "container"}
    async with ProxyStub("http://127.0.0.1:9") as proxy:
        config = run_config(
            run_id,
            tmp_path / "runs",
            nats_server.url,
            redis_server.url,
            proxy.port,
            tasks={"dirs": [str(tmp_path / "tasks")]},
            runner={"harness": "command", "command": HARNESS, "max_concurrent": 4, "sandbox": box},
            evaluator={"backoff_s": 0.2, "sandbox": box},
        )
        runner = RunnerProcess(config, tmp_path)
        runner_process.append(runner)
        events = await EventLog.attach(bus)
        eids = await dispatch_group(bus, redis, keys, "g1", "tasks/fix-sum", 3, publish=False)
        for eid in eids[:2]:
            await _request_start(bus, eid, "g1", int(eid[-1]))
        async with EvaluatorService(config):
            runner.start()
            await events.wait_for(ev.ExecutionStarted, 2, timeout_s=120)
            runner.kill()
            running = containers_of(client, **{LABEL_RUN: run_id})
            assert len(running) == 2 and all(client.containers.get(n).status == "running" for n in running)
            ghost = await _unrecorded_start(config, redis, keys, eids[2], tmp_path)
            runner.start()
            for name in running:  # the adopted harnesses finish their work under the new runner
                assert client.containers.get(name).exec_run(["touch", GO]).exit_code == 0
            ready = (await events.wait_for(ev.GroupReady, timeout_s=120))[0]
        terms = {e.execution.execution_id: e for e in events.of(ev.ExecutionTerminated)}
        done = {e.execution.execution_id: e for e in events.of(ev.EvaluationDone)}
    for eid in eids[:2]:  # adopted: finished on their own, scored in fresh containers of the image
        assert terms[eid].reason == cm.TERMINATION_REASON_COMPLETED, terms[eid]
        assert (done[eid].status, done[eid].reward) == (cm.EVALUATION_STATUS_VALID, 1.0), done[eid]
        assert "in a fresh container of the task's image" in done[eid].detail
    assert terms[eids[2]].reason == cm.TERMINATION_REASON_INFRA_FAILURE
    assert done[eids[2]].status == cm.EVALUATION_STATUS_PLACEHOLDER
    assert (ready.num_valid, ready.num_placeholder) == (2, 1)
    assert ghost not in {c.name for c in client.containers.list(all=True)}
    assert containers_of(client, **{LABEL_RUN: run_id}) == []


async def _request_start(bus: EventBus, eid: str, group: str, index: int) -> None:
    await bus.publish(
        ev.ExecutionStartRequested(
            execution=cm.ExecutionRef(execution_id=eid, group_id=group, index_in_group=index, query_id="q"),
            task_id="tasks/fix-sum",
            engine_id="cell-0",
            profile="generic",
        ),
        event_id=f"exec.start:{eid}",
    )


async def _unrecorded_start(
    config: GyreConfig, redis: aioredis.Redis, keys: Keys, eid: str, tmp_path: Path
) -> str:
    """What a runner killed mid-start leaves: the execution claimed and recorded as owned without a
    sandbox, and its container already created (carrying the run's and the execution's labels)."""
    ownership = Ownership(redis, keys, f"{socket.gethostname()}:runner")
    assert await ownership.claim(eid)
    await ownership.record(
        OwnedExecution(
            eid, "g1", 2, "q", "tasks/fix-sum", "cell-0", "generic", 0, 10**13, 10**13, str(tmp_path / eid)
        )
    )
    launcher = launcher_for_test("container", 0, 1, run_labels(config))
    spec = SandboxSpec(
        name=eid,
        argv=[],
        cwd=Path("/"),
        env={},
        root=tmp_path / "ghost",
        labels={LABEL_EXECUTION: eid, LABEL_ROLE: "execution"},
    )
    handle = await launcher.provision(spec)
    container = handle.container()
    assert container is not None
    await launcher.close()
    return str(container.name)
