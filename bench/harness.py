"""`gyre bench harness`: how many executions per minute the runner sustains on a trivial task, and
how long the evaluator takes from a termination to its evaluation.

    gyre bench harness [--executions 64] [--concurrency 8] [--group-size 8] [--task trivial|harbor]

Real nats-server and redis-server on loopback, the runner and the evaluator in-process with their
production sandboxes (isolated when root), an on-disk task run by the `command` harness, and a proxy
that only hands out credentials (the task makes no model call). `trivial`: a task.yaml task
(`echo ok > out.txt`, the built-in suites' score-line verifier); `harbor`: examples/tasks/fix-add (a no-op harness;
its tests/test.sh runs with Harbor's paths, bind-mounted when root).
`executions_per_min` = executions / (first dispatch → last termination); `evaluator_latency_ms_*`
from each execution's `ExecutionTerminated` to its `EvaluationDone` (event emission times).
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from gyre.bus import EventBus, decode_event
from gyre.bus.codec import TYPE_HEADER
from gyre.config import load_config
from gyre.log import configure_logging
from gyre.stack.servers import start_nats, start_redis
from gyre.store import Counters, ExecutionRecord, GroupRecord, Keys, Records, connect_redis
from gyre.tasks.builtin.arithmetic import VERIFY
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from gyre.v1 import proxy_pb2, proxy_pb2_grpc


class CredentialsOnlyProxy(proxy_pb2_grpc.ProxyServicer):
    """OpenExecution / CloseExecution only: the trivial task never calls the model."""

    async def OpenExecution(self, request: Any, context: Any) -> proxy_pb2.OpenExecutionResponse:
        return proxy_pb2.OpenExecutionResponse(base_url="http://127.0.0.1:9", api_key="bench")

    async def CloseExecution(self, request: Any, context: Any) -> proxy_pb2.CloseExecutionResponse:
        return proxy_pb2.CloseExecutionResponse()


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "fix-add"


async def run(executions: int, concurrency: int, group_size: int, work: Path, task: str = "trivial") -> dict[str, Any]:
    from services.evaluator.service import EvaluatorService
    from services.runner.service import RunnerService

    if task == "harbor":
        shutil.copytree(EXAMPLE, work / "tasks" / "fix-add")
        task_id, command = "tasks/fix-add", ["true"]
    else:
        (work / "tasks" / "trivial").mkdir(parents=True)
        (work / "tasks" / "trivial" / "task.yaml").write_text(yaml.safe_dump({
            "prompt": "echo ok > out.txt", "verifier": [*VERIFY, "out.txt=ok"],
            "harness_timeout_s": 60, "overall_budget_s": 300}))
        task_id, command = "tasks/trivial", ["bash", "-c", "{prompt}"]
    nats, redis_server = start_nats(work / "nats"), start_redis(work / "redis", appendonly=False)
    proxy = grpc.aio.server()
    proxy_pb2_grpc.add_ProxyServicer_to_server(CredentialsOnlyProxy(), proxy)  # type: ignore[abstract]
    proxy_port = proxy.add_insecure_port("127.0.0.1:0")
    await proxy.start()
    try:
        config = load_config(None, environ={}, overrides={
            "run": {"id": "bench", "dir": str(work / "runs")}, "nats": {"url": nats.url},
            "redis": {"url": redis_server.url}, "proxy": {"port": proxy_port}, "log": {"level": "warning"},
            "tasks": {"dirs": [str(work / "tasks")]},
            # uids of its own, apart from the defaults that tests and stacks on the same machine use
            "runner": {"harness": "command", "command": command, "max_concurrent": concurrency,
                       "sandbox": {"uid_base": 190000}},
            "evaluator": {"max_concurrent": concurrency, "sandbox": {"uid_base": 191000}},
        })
        bus = await EventBus.connect(nats.url, "bench", "bench")
        redis = await connect_redis(redis_server.url)
        keys = Keys("bench")
        times: dict[str, dict[str, int]] = {}
        done = asyncio.Event()

        async def on_msg(msg: Any) -> None:
            event = decode_event((msg.headers or {}).get(TYPE_HEADER, ""), msg.data)
            if isinstance(event, ev.ExecutionTerminated | ev.EvaluationDone):
                times.setdefault(event.execution.execution_id, {})[type(event).__name__] = event.meta.emitted_at_ms
                if sum(len(t) for t in times.values()) == 2 * executions:
                    done.set()

        await bus.nc.subscribe("gyre.bench.>", cb=on_msg)
        runner = RunnerService(config)
        async with runner, EvaluatorService(config):
            start_ms = int(time.time() * 1000)
            for g in range(0, executions, group_size):
                eids = [f"e{i}" for i in range(g, min(executions, g + group_size))]
                group = GroupRecord(f"g{g}", task_id, task_id, tuple(eids), 0, 0, start_ms)
                await Records(redis, keys).put_group(group, [
                    ExecutionRecord(e, group.group_id, i, task_id, task_id, 0, 0) for i, e in enumerate(eids)])
                await Counters(redis, keys).add("dispatched", len(eids))
                for i, e in enumerate(eids):
                    await bus.publish(ev.ExecutionStartRequested(
                        execution=cm.ExecutionRef(execution_id=e, group_id=group.group_id, index_in_group=i,
                                                  query_id=task_id), task_id=task_id))
            await asyncio.wait_for(done.wait(), timeout=600)
            isolation = runner.launcher.name
        last_ms = max(t["ExecutionTerminated"] for t in times.values())
        latencies = sorted(t["EvaluationDone"] - t["ExecutionTerminated"] for t in times.values())
        await bus.close()
        await redis.aclose()
    finally:
        await proxy.stop(0)
        nats.stop()
        redis_server.stop()
    wall_s = (last_ms - start_ms) / 1000
    return {
        "executions_per_min": round(executions / wall_s * 60, 1),
        "evaluator_latency_ms_p50": statistics.median(latencies),
        "evaluator_latency_ms_p90": latencies[int(0.9 * (len(latencies) - 1))],
        "executions": executions,
        "task": task,
        "max_concurrent": concurrency,
        "isolation": isolation,
        "wall_s": round(wall_s, 2),
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench harness", description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--task", choices=("trivial", "harbor"), default="trivial")
    args = parser.parse_args(argv)
    configure_logging("console", "warning")
    with tempfile.TemporaryDirectory(prefix="gyre-bench-harness-") as tmp:
        result = asyncio.run(run(args.executions, args.concurrency, args.group_size, Path(tmp), args.task))
    print(json.dumps(result))
