"""Runner + evaluator against real NATS and Redis: one test per outcome class, and a group that
turns ready exactly once under duplicate deliveries of every event."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre.bus import EventBus
from gyre.store import Counters, Keys
from gyre.store.groups import GroupOutcomes
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.evaluator.service import EvaluatorService
from services.evaluator.store import EvaluationStore
from services.runner.service import RunnerService
from tests.support.proxy_stub import ProxyStub
from tests.support.runner_env import EventLog, dispatch_group, run_config, stream_events, write_task
from tests.support.scripted_anthropic import ScriptedAnthropic, arithmetic_solver

pytestmark = pytest.mark.slow  # real services and sandboxes: several seconds per test

VERIFY = ["{python}", "-m", "gyre.tasks.builtin.verify"]


@pytest.fixture
async def proxy() -> AsyncIterator[ProxyStub]:
    with ScriptedAnthropic(arithmetic_solver) as api:
        async with ProxyStub(api.base_url) as stub:
            yield stub


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    root = tmp_path / "tasks"
    root.mkdir()
    return root


def configure(
    run_id: str,
    tmp_path: Path,
    nats: ServerProcess,
    redis: ServerProcess,
    proxy: ProxyStub,
    tasks: Path,
    harness: str = "command",
    command: list[str] | None = None,
    **evaluator: Any,
) -> Any:
    return run_config(
        run_id,
        tmp_path / "runs",
        nats.url,
        redis.url,
        proxy.port,
        tasks={"dirs": [str(tasks)]},
        runner={
            "harness": harness,
            "command": command or ["bash", "-c", "{prompt}"],
            "max_concurrent": 4,
            "sandbox": {"kill_grace_s": 1.0},
        },
        evaluator={"backoff_s": 0.2, "max_concurrent": 2, "sandbox": {"kill_grace_s": 1.0}, **evaluator},
    )


async def run_group(
    config: Any,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    task_id: str,
    size: int = 1,
    timeout_s: float = 60.0,
) -> tuple[list[Any], list[Any], EventLog]:
    """Dispatch one group, run runner + evaluator until it is ready; (terminated, evaluated, log)."""
    events = await EventLog.attach(bus)
    async with RunnerService(config), EvaluatorService(config):
        await dispatch_group(bus, redis, keys, "g1", task_id, size)
        await events.wait_for(ev.GroupReady, timeout_s=timeout_s)
    terminated = sorted(events.of(ev.ExecutionTerminated), key=lambda e: e.execution.index_in_group)
    done = sorted(events.of(ev.EvaluationDone), key=lambda e: e.execution.index_in_group)
    return terminated, done, events


async def test_completed_execution_is_scored(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
    tasks: Path,
) -> None:
    config = configure(run_id, tmp_path, nats_server, redis_server, proxy, tasks, harness="demo")
    (term,), (done,), events = await run_group(config, bus, redis, keys, "add/3+5")
    assert term.reason == cm.TERMINATION_REASON_COMPLETED
    assert (done.status, done.reward, done.attempts) == (cm.EVALUATION_STATUS_VALID, 1.0, 1)
    assert done.workspace.content_hash == term.workspace.content_hash
    (stored,) = await EvaluationStore(redis, keys).all(term.execution.execution_id)
    assert (stored.status, stored.workspace_hash) == ("valid", term.workspace.content_hash)
    (ready,) = events.of(ev.GroupReady)
    assert (ready.group_id, ready.num_valid, ready.mean_reward) == ("g1", 1, 1.0)


async def test_harness_timeout_keeps_partial_work_scored_above_zero(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
    tasks: Path,
) -> None:
    task = write_task(
        tasks,
        "two_parts",
        "echo 8 > a.txt; sleep 600; echo 4 > b.txt",
        [*VERIFY, "a.txt=8", "b.txt=4"],
        harness_timeout_s=2,
        overall_budget_s=60,
    )
    config = configure(run_id, tmp_path, nats_server, redis_server, proxy, tasks)
    (term,), (done,), _ = await run_group(config, bus, redis, keys, task)
    assert term.reason == cm.TERMINATION_REASON_HARNESS_TIMEOUT
    assert done.status == cm.EVALUATION_STATUS_VALID and done.reward == pytest.approx(0.5)


async def test_overall_timeout_is_excluded_not_zero(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
    tasks: Path,
) -> None:
    task = write_task(
        tasks,
        "endless",
        "echo 8 > a.txt; sleep 600",
        [*VERIFY, "a.txt=8"],
        harness_timeout_s=2,
        overall_budget_s=2,
    )
    config = configure(run_id, tmp_path, nats_server, redis_server, proxy, tasks)
    (term,), (done,), events = await run_group(config, bus, redis, keys, task)
    assert term.reason == cm.TERMINATION_REASON_OVERALL_TIMEOUT
    assert done.status == cm.EVALUATION_STATUS_EXCLUDED and "budget" in done.detail
    (ready,) = events.of(ev.GroupReady)
    assert (ready.num_valid, ready.num_excluded, ready.mean_reward) == (0, 1, 0.0)


def flaky_verifier(tasks: Path, name: str, failures: int) -> list[str]:
    """A verifier that crashes `failures` times (state kept in a world-writable dir), then scores 1."""
    state = tasks / name / "state"
    state.mkdir(parents=True)
    os.chmod(state, 0o777)
    script = (
        f"n=$(cat {state}/n 2>/dev/null || echo 0); echo $((n+1)) > {state}/n; "
        f"[ $n -ge {failures} ] || {{ echo crash >&2; exit 3; }}; echo '{{\"score\": 1.0}}'"
    )
    return ["bash", "-c", script]


async def test_verifier_crash_then_success_on_retry(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
    tasks: Path,
) -> None:
    task = write_task(tasks, "flaky", "echo done > out.txt", flaky_verifier(tasks, "flaky", failures=1))
    config = configure(run_id, tmp_path, nats_server, redis_server, proxy, tasks)
    (term,), (done,), _ = await run_group(config, bus, redis, keys, task)
    assert term.reason == cm.TERMINATION_REASON_COMPLETED
    assert (done.status, done.reward, done.attempts) == (cm.EVALUATION_STATUS_VALID, 1.0, 2)


async def test_verifier_crashing_until_the_budget_is_spent_is_excluded(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
    tasks: Path,
) -> None:
    task = write_task(
        tasks,
        "broken",
        "echo done > out.txt",
        flaky_verifier(tasks, "broken", failures=10**6),
        harness_timeout_s=3,
        overall_budget_s=4,
    )
    config = configure(run_id, tmp_path, nats_server, redis_server, proxy, tasks, max_attempts=50)
    (term,), (done,), _ = await run_group(config, bus, redis, keys, task)
    assert term.reason == cm.TERMINATION_REASON_COMPLETED
    assert done.status == cm.EVALUATION_STATUS_EXCLUDED and done.attempts >= 2
    assert "no valid score within the budget" in done.detail and "crash" in done.detail


async def test_sandbox_that_never_started_is_a_zero_placeholder(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
    tasks: Path,
) -> None:
    task = write_task(tasks, "any", "anything", [*VERIFY, "a.txt=1"])
    config = configure(
        run_id, tmp_path, nats_server, redis_server, proxy, tasks, command=["/no/such/harness"]
    )
    (term,), (done,), events = await run_group(config, bus, redis, keys, task)
    assert term.reason == cm.TERMINATION_REASON_INFRA_FAILURE and "never started" in term.detail
    assert term.workspace.path == ""
    assert (done.status, done.reward) == (cm.EVALUATION_STATUS_PLACEHOLDER, 0.0)
    (ready,) = events.of(ev.GroupReady)
    assert (ready.num_placeholder, ready.mean_reward) == (1, 0.0)


async def test_group_turns_ready_exactly_once_under_duplicate_deliveries(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
    tasks: Path,
) -> None:
    task = write_task(tasks, "mixed", "echo $RANDOM > a.txt", [*VERIFY, "a.txt=1"])
    config = configure(run_id, tmp_path, nats_server, redis_server, proxy, tasks)
    events = await EventLog.attach(bus)
    async with RunnerService(config), EvaluatorService(config) as first, EvaluatorService(config, instance=1):
        eids = await dispatch_group(bus, redis, keys, "g1", task, 3)
        starts = await events.wait_for(ev.ExecutionStartRequested, 3)
        terms = await events.wait_for(ev.ExecutionTerminated, 3, timeout_s=60)
        # Every start request and every termination delivered twice more, under fresh event ids
        # (as after JetStream's duplicate window), while the group is being evaluated.
        for event in [*starts, *terms, *starts, *terms]:
            copy = type(event)()
            copy.CopyFrom(event)
            copy.meta.event_id = ""
            await bus.publish(copy)
        # And a reclaimed work item processed by two workers at once, for every member.
        await asyncio.gather(*(first.process(t) for t in [*terms, *terms]))
        # Barrier: a later group has gone through both services after all of the above.
        await dispatch_group(bus, redis, keys, "g2", task, 1)
        await events.wait_for(ev.GroupReady, where=lambda e: e.group_id == "g2", timeout_s=60)
        await events.wait_for(ev.GroupReady, where=lambda e: e.group_id == "g1", timeout_s=60)
    ready = await stream_events(bus, ev.GroupReady)
    assert sorted(e.group_id for e in ready) == ["g1", "g2"]
    assert (
        len(events.of(ev.GroupReady, lambda e: e.group_id == "g1")) == 1
    )  # published once, not deduplicated
    assert len(await stream_events(bus, ev.ExecutionStarted)) == 4
    assert len(await stream_events(bus, ev.ExecutionTerminated)) == 3 + 6 + 1
    done = await stream_events(bus, ev.EvaluationDone)
    assert sorted(e.execution.execution_id for e in done) == sorted([*eids, "g2-e0"])
    store = EvaluationStore(redis, keys)
    assert [len(await store.all(e)) for e in eids] == [1, 1, 1]
    group = await GroupOutcomes(redis, keys).get("g1")
    assert group is not None and group.state == "ready" and len(group.members) == 3
    assert [m.status for m in group.members] == ["valid"] * 3
    assert (await Counters(redis, keys).get()).finished == 4
