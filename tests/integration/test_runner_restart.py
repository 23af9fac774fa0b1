"""A runner killed with SIGKILL mid-execution and restarted: every execution it owned ends with
a termination event and none stays running (sandboxes that survived are adopted and held to
their deadline; sandboxes that died meanwhile are reported with what is known of them; a start whose
request was acknowledged but whose sandbox was never launched is reported as never started)."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre import procs
from gyre.bus import EventBus, command_stream
from gyre.store import Counters, Keys
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.runner.ownership import Ownership
from services.runner.service import START_CONSUMER
from tests.support.eventually import eventually
from tests.support.proxy_stub import ProxyStub
from tests.support.runner_env import (
    EventLog,
    RunnerProcess,
    dispatch_group,
    run_config,
    stream_events,
    write_task,
)
from tests.support.scripted_anthropic import ScriptedAnthropic, text

pytestmark = pytest.mark.slow  # real services and sandboxes: several seconds per test

UID_BASE = 160000
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def proxy() -> AsyncIterator[ProxyStub]:
    with ScriptedAnthropic(lambda request: text("hi")) as api:
        async with ProxyStub(api.base_url, hold_groups=frozenset({"held"})) as stub:
            yield stub


@pytest.fixture
def runner_process(tmp_path: Path) -> Iterator[list[RunnerProcess]]:
    started: list[RunnerProcess] = []
    yield started
    for runner in started:
        runner.stop()


async def test_sigkilled_runner_reconciles_every_execution_on_restart(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
    runner_process: list[RunnerProcess],
) -> None:
    tasks = tmp_path / "tasks"
    survives = write_task(tasks, "survives", "echo started > s.txt; sleep 600", ["true"], harness_timeout_s=6)
    dies = write_task(tasks, "dies", "echo started > s.txt; sleep 600", ["true"], harness_timeout_s=60)
    finishes = write_task(
        tasks, "finishes", "while [ ! -e go ]; do sleep 0.05; done; echo done > out.txt", ["true"]
    )
    held = write_task(tasks, "held", "echo started > s.txt", ["true"])  # its OpenExecution never answers
    config = run_config(
        run_id,
        tmp_path / "runs",
        nats_server.url,
        redis_server.url,
        proxy.port,
        tasks={"dirs": [str(tasks)]},
        runner={
            "harness": "command",
            "command": ["bash", "-c", "{prompt}"],
            "max_concurrent": 5,
            "sandbox": {"uid_base": UID_BASE, "kill_grace_s": 1.0},
        },
    )
    runner = RunnerProcess(config, tmp_path)
    runner_process.append(runner)
    events = await EventLog.attach(bus)
    runner.start()
    for group, task in (("survives", survives), ("dies", dies), ("finishes", finishes), ("held", held)):
        await dispatch_group(bus, redis, keys, group, task, 1)
    await _redeliver(bus, "held-e0", held)
    await events.wait_for(ev.ExecutionStarted, 3, timeout_s=60)
    # Every request is acknowledged, the held one too (its start is claimed and under way) and the
    # redelivery of it, which the runner skipped: nothing of it is reported before the kill.
    await eventually(lambda: proxy.held, what="the held start to ask for its credentials")
    await eventually(lambda: _all_acknowledged(bus), what="every start request to be acknowledged")
    assert proxy.held == ["held-e0"]
    ownership = Ownership(redis, keys, f"{socket.gethostname()}:runner")
    owned = {o.group_id: o for o in await ownership.owned()}
    assert set(owned) == {"survives", "dies", "finishes", "held"} and owned["held"].sandbox is None

    runner.kill()
    assert not events.of(ev.ExecutionTerminated)
    # While the runner is down: one sandbox dies outright, one harness finishes on its own.
    dead = owned["dies"].sandbox
    assert dead is not None
    os.killpg(dead.pid, signal.SIGKILL)
    (Path(owned["finishes"].workspace) / "go").touch()
    sandbox = owned["finishes"].sandbox
    assert sandbox is not None
    await eventually(lambda: not procs.alive(sandbox.pid, sandbox.started), what="the sandbox to finish")

    runner.start()
    terms = {e.execution.group_id: e for e in await events.wait_for(ev.ExecutionTerminated, 4, timeout_s=60)}
    assert terms["held"].reason == cm.TERMINATION_REASON_INFRA_FAILURE
    assert "the runner stopped before launching it" in terms["held"].detail
    assert terms["finishes"].reason == cm.TERMINATION_REASON_COMPLETED
    assert (Path(terms["finishes"].workspace.path) / "out.txt").read_text() == "done\n"
    assert terms["dies"].reason == cm.TERMINATION_REASON_INFRA_FAILURE
    assert "runner lost the process" in terms["dies"].detail and terms["dies"].workspace.content_hash
    assert terms["survives"].reason == cm.TERMINATION_REASON_HARNESS_TIMEOUT  # adopted, held to its deadline
    assert (Path(terms["survives"].workspace.path) / "s.txt").read_text() == "started\n"

    async def dropped() -> bool:  # the record is dropped right after the termination is published
        return not await ownership.owned()

    await eventually(dropped, timeout_s=5, what="the ownership record to be dropped")
    assert await ownership.owned() == []
    assert [p for uid in range(UID_BASE, UID_BASE + 5) for p in procs.pids_of_uid(uid)] == []
    for group in ("survives", "dies", "finishes"):
        box = owned[group].sandbox
        assert box is not None and not procs.alive(box.pid, box.started)
    counters = await Counters(redis, keys).get()
    assert (counters.started, counters.finished) == (4, 4)
    reported = [e.execution.execution_id for e in await stream_events(bus, ev.ExecutionTerminated)]
    assert sorted(reported) == sorted(o.execution_id for o in owned.values())


async def _redeliver(bus: EventBus, eid: str, task_id: str) -> None:
    """The same start request again, as the work queue delivers it when an acknowledgement is lost."""
    await bus.publish(
        ev.ExecutionStartRequested(
            execution=cm.ExecutionRef(execution_id=eid, group_id="held", index_in_group=0, query_id=task_id),
            task_id=task_id,
            engine_id="cell-0",
            profile="generic",
        ),
        event_id=f"exec.start:{eid}:again",
    )


async def _all_acknowledged(bus: EventBus) -> bool:
    info = await bus.js.consumer_info(command_stream(bus.run_id).name, START_CONSUMER)
    return (info.num_pending, info.num_ack_pending) == (0, 0)
