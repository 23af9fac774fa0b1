"""Bad outcomes of a Harbor task through runner → evaluator → the run report, with real NATS, Redis
and sandboxes: a verifier that writes no reward is pending, retried, then excluded at the budget
and counted in `executions.excluded`; a harness that exits at once terminates FAILED, its preserved
workspace is still scored by test.sh, and `terminations` counts it."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from app.demo.events import RecordedEvent
from app.demo.report import RunFacts, summarize
from app.stack.servers import ServerProcess
from gyre.bus import EventBus
from gyre.store import Keys
from gyre.tasks import TaskSet
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.evaluator.service import EvaluatorService
from services.runner.service import RunnerService
from services.scheduler.dispatch import Dispatcher, QuerySource
from tests.support.proxy_stub import ProxyStub
from tests.support.runner_env import EventLog, run_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tasks" / "fix-add"
#: test.sh: no reward at all when the agent left `no-reward`; else 1 with `marker`, 0 without.
TEST_SH = """#!/bin/bash
[ -f no-reward ] && { echo 'tests ran; the reward was never written'; exit 0; }
if [ -f marker ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
#: Member 0 does the work, member 1 leaves the verifier without a reward, member 2 exits at once.
HARNESS = [
    "bash",
    "-c",
    "case {execution_id} in *-e00) touch marker;; *-e01) touch no-reward;; *) exit 3;; esac",
]


@pytest.fixture
async def proxy() -> AsyncIterator[ProxyStub]:
    async with ProxyStub("http://127.0.0.1:9") as stub:
        yield stub


async def test_missing_reward_is_excluded_at_the_budget_and_an_early_exit_is_failed_and_scored(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    task_dir = tmp_path / "harbor" / "fix-add"
    shutil.copytree(EXAMPLE, task_dir)
    (task_dir / "tests" / "test.sh").write_text(TEST_SH)
    toml = task_dir / "task.toml"
    # Budget = agent 6 s + 2 x verifier 3 s = 12 s: room for a few attempts of the reward-less verifier. The
    # agent's 6 s is for a loaded machine: with 2 s, member 0's `touch marker` timed out once in a full run.
    toml.write_text(
        toml.read_text()
        .replace("timeout_sec = 60.0", "timeout_sec = 3.0")
        .replace("timeout_sec = 300.0", "timeout_sec = 6.0")
    )
    config = run_config(
        run_id,
        tmp_path / "runs",
        nats_server.url,
        redis_server.url,
        proxy.port,
        tasks={"dirs": [str(tmp_path / "harbor")]},
        runner={
            "harness": "command",
            "command": HARNESS,
            "max_concurrent": 3,
            "sandbox": {"kill_grace_s": 1.0, "uid_base": 183000},
        },  # uids of its own (see test_task_dispatch)
        evaluator={
            "backoff_s": 0.2,
            "max_attempts": 50,
            "max_concurrent": 3,
            "sandbox": {"kill_grace_s": 1.0, "uid_base": 184000},
        },
    )
    dispatcher = Dispatcher(
        redis, keys, bus, "generic", QuerySource(TaskSet.from_section(config.tasks), seed=0), group_size=3
    )
    events = await EventLog.attach(bus)
    async with RunnerService(config), EvaluatorService(config):
        (group_id,) = await dispatcher.dispatch(num_groups=1, group_size=3, policy_version=0, burst=0)
        await dispatcher.start("cell-0", 3)
        (ready,) = await events.wait_for(ev.GroupReady, timeout_s=90)
    terms = {e.execution.execution_id[-3:]: e for e in events.of(ev.ExecutionTerminated)}
    done = {e.execution.execution_id[-3:]: e for e in events.of(ev.EvaluationDone)}

    assert (terms["e00"].reason, done["e00"].status, done["e00"].reward) == (
        cm.TERMINATION_REASON_COMPLETED,
        cm.EVALUATION_STATUS_VALID,
        1.0,
    )
    # No reward: every attempt is pending; at the budget the execution is excluded, not a zero.
    assert terms["e01"].reason == cm.TERMINATION_REASON_COMPLETED
    assert (done["e01"].status, done["e01"].reward) == (cm.EVALUATION_STATUS_EXCLUDED, 0.0)
    assert done["e01"].attempts >= 2 and "no valid score within the budget" in done["e01"].detail
    assert "the verifier wrote no reward" in done["e01"].detail
    # Exited at once: FAILED with its exit code; test.sh still scores the preserved workspace.
    assert (terms["e02"].reason, terms["e02"].exit_code) == (cm.TERMINATION_REASON_FAILED, 3)
    assert terms["e02"].workspace.path and (done["e02"].status, done["e02"].reward) == (
        cm.EVALUATION_STATUS_VALID,
        0.0,
    )
    assert (ready.num_valid, ready.num_excluded, ready.mean_reward) == (2, 1, 0.5)

    # The run report over these events and the step that consumed the group (what the packer and the
    # core publish): each execution accounted once, by outcome and by termination class.
    recorded = [
        *events.events,
        ev.GroupPacked(batch_id=f"{run_id}-b0", group_id=group_id, staleness=0),
        ev.StepCompleted(batch_id=f"{run_id}-b0", policy_version=1),
    ]
    facts = RunFacts(
        mode="elastic", phi=0.0, mu=1, num_cells=1, group_size=3, cell_capacity=3, separate_pool_capacity=0
    )
    summary = summarize([RecordedEvent("s", float(i), e) for i, e in enumerate(recorded)], facts)
    assert summary["executions"] == {
        "dispatched": 3,
        "trained": 2,
        "excluded": 1,
        "placeholder": 0,
        "cancelled": 0,
        "unconsumed": 0,
    }
    assert summary["terminations"] == {"completed": 2, "failed": 1}
