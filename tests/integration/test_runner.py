"""The runner against real NATS and Redis, a proxy stub and a scripted model endpoint."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre.bus import EventBus
from gyre.sandbox.workspace import content_hash
from gyre.store import Counters, Keys
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.runner.service import RunnerService
from tests.support.proxy_stub import ProxyStub
from tests.support.runner_env import EventLog, dispatch_group, run_config
from tests.support.scripted_anthropic import ScriptedAnthropic, arithmetic_solver

pytestmark = pytest.mark.slow  # real services and sandboxes: several seconds per test


@pytest.fixture
async def api() -> AsyncIterator[ScriptedAnthropic]:
    with ScriptedAnthropic(arithmetic_solver) as endpoint:
        yield endpoint


@pytest.fixture
async def proxy(api: ScriptedAnthropic) -> AsyncIterator[ProxyStub]:
    async with ProxyStub(api.base_url) as stub:
        yield stub


def config_for(
    run_id: str, tmp_path: Path, nats: ServerProcess, redis: ServerProcess, proxy: ProxyStub, **runner: Any
) -> Any:
    return run_config(
        run_id,
        tmp_path,
        nats.url,
        redis.url,
        proxy.port,
        runner={"max_concurrent": 4, "sandbox": {"kill_grace_s": 1.0}, **runner},
    )


async def test_demo_harness_executions_complete_and_report(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
    api: ScriptedAnthropic,
) -> None:
    events = await EventLog.attach(bus)
    config = config_for(run_id, tmp_path, nats_server, redis_server, proxy)
    async with RunnerService(config):
        eids = await dispatch_group(bus, redis, keys, "g1", "add/3+5", 2)
        done = await events.wait_for(ev.ExecutionTerminated, 2, timeout_s=60)
    assert {e.execution.execution_id for e in done} == set(eids)
    for term in done:
        assert term.reason == cm.TERMINATION_REASON_COMPLETED, term.detail
        workspace = Path(term.workspace.path)
        assert (workspace / "answer.txt").read_text() == "8"
        assert term.workspace.content_hash == content_hash(workspace)
        assert os.stat(workspace).st_uid == 0  # preserved: handed back to root
        assert term.task_id == "add/3+5" and term.budget_deadline_ms > 0
    assert len(events.of(ev.ExecutionStarted)) == 2
    assert set(proxy.opened) == set(eids) and sorted(proxy.closed) == sorted(eids)
    # The harness reached the scripted model through the sandbox relay, with its own key.
    assert {r.api_key for r in api.requests} == {ProxyStub.key_for(e) for e in eids}
    counters = await Counters(redis, keys).get()
    assert (counters.dispatched, counters.started, counters.finished) == (2, 2, 2)


async def test_a_start_that_cannot_run_terminates_as_infra_failure(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    events = await EventLog.attach(bus)
    config = config_for(run_id, tmp_path, nats_server, redis_server, proxy)
    async with RunnerService(config):
        (_eid,) = await dispatch_group(bus, redis, keys, "g1", "nope/1", 1)
        (term,) = await events.wait_for(ev.ExecutionTerminated)
    assert term.reason == cm.TERMINATION_REASON_INFRA_FAILURE
    assert term.workspace.path == "" and "unknown task" in term.detail
    assert not events.of(ev.ExecutionStarted)
    counters = await Counters(redis, keys).get()
    assert (counters.started, counters.finished) == (1, 1)
