"""End to end through the real proxy: the runner starts the demo harness in its sandbox, the
harness reaches the proxy through the relay, the proxy records the calls and asks a scripted
embedded engine, the workspace is preserved and the evaluator scores it."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre.bus import EventBus
from gyre.store import Keys
from gyre.store.trees import TreeStore
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.evaluator.service import EvaluatorService
from services.runner.service import RunnerService
from tests.support.proxy_stack import proxy_stack, scripted_engine
from tests.support.runner_env import EventLog, dispatch_group, run_config

pytestmark = pytest.mark.slow  # real services, a sandboxed harness and an engine

CALL = '<tool_call>{"name":"write_file","arguments":{"path":"answer.txt","content":"%s"}}</tool_call>'


async def test_demo_harness_through_the_real_proxy_is_recorded_and_scored(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
) -> None:
    events = await EventLog.attach(bus)
    async with proxy_stack(
        nats_server.url, redis_server.url, tmp_path / "proxy", run_id, {"cell-0": scripted_engine()}
    ) as proxy:
        # One execution at a time, so the FIFO script answers each execution's two calls in order.
        await proxy.script("cell-0", [CALL % "8", "Done.", CALL % "7", "Done."])
        config = run_config(
            run_id,
            tmp_path / "runs",
            nats_server.url,
            redis_server.url,
            proxy.service.grpc_port,
            runner={"max_concurrent": 1, "sandbox": {"kill_grace_s": 1.0}},
        )
        async with RunnerService(config), EvaluatorService(config):
            eids = await dispatch_group(bus, redis, keys, "g1", "add/3+5", 2)
            await events.wait_for(ev.GroupReady, timeout_s=120)
        stats = await proxy.stats()
    terms = {e.execution.execution_id: e for e in events.of(ev.ExecutionTerminated)}
    done = {e.execution.execution_id: e for e in events.of(ev.EvaluationDone)}
    assert all(t.reason == cm.TERMINATION_REASON_COMPLETED for t in terms.values())
    assert sorted(round(d.reward, 3) for d in done.values()) == [0.2, 1.0]  # right, then written but wrong
    assert stats.requests == 4 and stats.server_errors == 0
    for eid in eids:
        tree = await TreeStore(redis, keys).load(eid)
        assert len(tree.leaves()) == 1  # one main path: call, tool result, final answer
