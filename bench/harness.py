"""`gyre bench harness`: what one execution costs the machine to start and run, how many executions per
minute the runner sustains, and how long the evaluator takes from a termination to its evaluation.

    gyre bench harness [--task demo|trivial|harbor] [--start both|fork|plain] [--executions 32]
                       [--concurrency 8] [--group-size 8]

Real nats-server and redis-server on loopback, the runner and the evaluator in-process with their
production sandboxes (isolated when root), and a proxy that only hands out credentials.
`demo` (default): the demo harness (`python -m harness`, the official anthropic SDK, its agent loop and
tools) on a built-in `add/` task against a scripted Messages endpoint (bench/_scripted_messages.py: one
write_file call, then a final answer; it stands in for the model, which is not what is measured), once
per start: `plain` starts each sandbox's harness as a new interpreter, `fork` forks it from the runner's
pre-imported fork server (gyre/sandbox/forkserver.py), the runner's default. `trivial`: a
task.yaml task (`echo ok > out.txt`) run by the `command` harness; `harbor`: examples/tasks/fix-add (a
no-op harness; its tests/test.sh runs with Harbor's paths, bind-mounted when root); both start plainly.

    cpu_s_per_execution         CPU seconds per execution of everything the runner started for it: the
                                sandbox supervisor, its namespace child and the harness (status.json
                                `sandbox_cpu_s`), plus the fork server's one-time preload divided over the
                                executions (fork start)
    cpu_s_per_execution_plain   the same with plain starts, measured in the same run
    cpu_ratio_plain_vs_fork     the two divided (goal >= 3)
    harness_cpu_s_per_execution the harness process alone (status.json `cpu_s`), per start
    executions_per_min          executions / (first dispatch → last termination), per start
    evaluator_latency_ms_*      from each `ExecutionTerminated` to its `EvaluationDone` (emission times)

Keys without a suffix are the default start of the task (fork for `demo`, plain otherwise); `_plain`
keys are the plain start. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from app.stack.servers import start_nats, start_redis
from bench._scripted_messages import ScriptedMessages
from bench._startup import run_bench
from gyre.bus import EventBus, decode_event
from gyre.bus.codec import TYPE_HEADER
from gyre.config import GyreConfig, load_config
from gyre.paths import REPO_ROOT
from gyre.rpc import bind, new_server
from gyre.store import Counters, ExecutionRecord, GroupRecord, Keys, Records, connect_redis
from gyre.tasks.builtin.arithmetic import VERIFY
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from gyre.v1 import proxy_pb2, proxy_pb2_grpc

EXAMPLE = REPO_ROOT / "examples" / "tasks" / "fix-add"
DEMO_TASK = "add/3+5"


class CredentialsOnlyProxy(proxy_pb2_grpc.ProxyServicer):
    """OpenExecution / CloseExecution only, pointing harnesses at `base_url` (the scripted endpoint)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    async def OpenExecution(self, request: Any, context: Any) -> proxy_pb2.OpenExecutionResponse:
        return proxy_pb2.OpenExecutionResponse(base_url=self.base_url, api_key="bench")

    async def CloseExecution(self, request: Any, context: Any) -> proxy_pb2.CloseExecutionResponse:
        return proxy_pb2.CloseExecutionResponse()


def _runner_settings(task: str, work: Path) -> tuple[str, dict[str, Any]]:
    """The task id and the runner's harness settings for `task`."""
    if task == "demo":
        return DEMO_TASK, {"harness": "demo"}
    if task == "harbor":
        shutil.copytree(EXAMPLE, work / "tasks" / "fix-add", dirs_exist_ok=True)
        return "tasks/fix-add", {"harness": "command", "command": ["true"]}
    (work / "tasks" / "trivial").mkdir(parents=True, exist_ok=True)
    (work / "tasks" / "trivial" / "task.yaml").write_text(
        yaml.safe_dump(
            {
                "prompt": "echo ok > out.txt",
                "verifier": [*VERIFY, "out.txt=ok"],
                "harness_timeout_s": 60,
                "overall_budget_s": 300,
            }
        )
    )
    return "tasks/trivial", {"harness": "command", "command": ["bash", "-c", "{prompt}"]}


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _phase_config(
    start: str, task: str, concurrency: int, work: Path, urls: dict[str, str], proxy_port: int
) -> tuple[str, GyreConfig]:
    """The task id and the config of one phase: its own run, runner and evaluator settings."""
    task_id, runner = _runner_settings(task, work)
    dirs = [str(work / "tasks")] if task != "demo" else []
    config = load_config(
        None,
        environ={},
        overrides={
            "run": {"id": f"bench{start}", "dir": str(work / "runs")},
            "nats": {"url": urls["nats"]},
            "redis": {"url": urls["redis"]},
            "proxy": {"port": proxy_port},
            "log": {"level": "warning"},
            "tasks": {"dirs": dirs},
            # uids of its own, apart from the defaults that tests and stacks on the same machine use
            "runner": {
                **runner,
                "max_concurrent": concurrency,
                "fork_server": start == "fork",
                "sandbox": {"uid_base": 190000},
            },
            "evaluator": {"max_concurrent": concurrency, "sandbox": {"uid_base": 191000}},
        },
    )
    return task_id, config


async def _dispatch(
    bus: EventBus, redis: Any, keys: Keys, task_id: str, executions: int, group_size: int, start_ms: int
) -> None:
    """Dispatch `executions` executions of `task_id` in groups, as the scheduler would."""
    for g in range(0, executions, group_size):
        eids = [f"e{i}" for i in range(g, min(executions, g + group_size))]
        group = GroupRecord(f"g{g}", task_id, task_id, tuple(eids), 0, 0, start_ms)
        await Records(redis, keys).put_group(
            group,
            [ExecutionRecord(e, group.group_id, i, task_id, task_id, 0, 0) for i, e in enumerate(eids)],
        )
        await Counters(redis, keys).add("dispatched", len(eids))
        for i, e in enumerate(eids):
            await bus.publish(
                ev.ExecutionStartRequested(
                    execution=cm.ExecutionRef(
                        execution_id=e, group_id=group.group_id, index_in_group=i, query_id=task_id
                    ),
                    task_id=task_id,
                )
            )


async def phase(
    start: str,
    task: str,
    executions: int,
    concurrency: int,
    group_size: int,
    work: Path,
    urls: dict[str, str],
    proxy_port: int,
) -> dict[str, Any]:
    """One runner + evaluator over `executions` executions of `task` with one start mode."""
    from services.evaluator.service import EvaluatorService
    from services.runner.service import RunnerService

    task_id, config = _phase_config(start, task, concurrency, work, urls, proxy_port)
    run_id = config.run.id
    bus = await EventBus.connect(urls["nats"], run_id, "bench")
    redis = await connect_redis(urls["redis"])
    times: dict[str, dict[str, int]] = {}
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        event = decode_event((msg.headers or {}).get(TYPE_HEADER, ""), msg.data)
        if isinstance(event, ev.ExecutionTerminated | ev.EvaluationDone):
            times.setdefault(event.execution.execution_id, {})[type(event).__name__] = (
                event.meta.emitted_at_ms
            )
            if sum(len(t) for t in times.values()) == 2 * executions:
                done.set()

    await bus.nc.subscribe(f"gyre.{run_id}.>", cb=on_msg)
    cpu_before = _children_cpu_s()
    runner_service = RunnerService(config)
    async with runner_service, EvaluatorService(config):
        server = runner_service.fork_server
        if server is not None and not await server.ready():
            raise RuntimeError(f"the fork server did not start: {server.error}")
        preload_cpu_s = float(server.info.get("preload_cpu_s", 0.0)) if server is not None else 0.0
        start_ms = int(time.time() * 1000)
        await _dispatch(bus, redis, Keys(run_id), task_id, executions, group_size, start_ms)
        await asyncio.wait_for(done.wait(), timeout=900)
        isolation = runner_service.launcher.name
    children_cpu_s = _children_cpu_s() - cpu_before  # the fork server included: it exited with the runner
    await bus.close()
    await redis.aclose()
    return _phase_figures(config, times, executions, start_ms, preload_cpu_s, children_cpu_s, isolation)


def _phase_figures(
    config: GyreConfig,
    times: dict[str, dict[str, int]],
    executions: int,
    start_ms: int,
    preload_cpu_s: float,
    children_cpu_s: float,
    isolation: str,
) -> dict[str, Any]:
    """What one phase measured, from the sandboxes' status files and the events' times."""
    statuses = [
        json.loads(p.read_text()) for p in (config.run.path / "sandboxes").glob("*/control/status.json")
    ]
    failed = [s for s in statuses if s.get("exit_code") != 0]
    if len(statuses) != executions or failed:
        raise RuntimeError(f"{len(failed)} of {len(statuses)} executions failed, e.g. {failed[:1]}")
    last_ms = max(t["ExecutionTerminated"] for t in times.values())
    latencies = sorted(t["EvaluationDone"] - t["ExecutionTerminated"] for t in times.values())
    wall_s = (last_ms - start_ms) / 1000
    return {
        "cpu_s_per_execution": round(
            statistics.fmean(s["sandbox_cpu_s"] for s in statuses) + preload_cpu_s / executions, 3
        ),
        "harness_cpu_s_per_execution": round(statistics.fmean(s["cpu_s"] for s in statuses), 3),
        "children_cpu_s_per_execution": round(children_cpu_s / executions, 3),
        "fork_server_preload_cpu_s": preload_cpu_s,
        "executions_per_min": round(executions / wall_s * 60, 1),
        "evaluator_latency_ms_p50": statistics.median(latencies),
        "evaluator_latency_ms_p90": latencies[int(0.9 * (len(latencies) - 1))],
        "wall_s": round(wall_s, 2),
        "isolation": isolation,
    }


async def run(
    task: str, starts: list[str], executions: int, concurrency: int, group_size: int, work: Path
) -> dict[str, Any]:
    nats, redis_server = start_nats(work / "nats"), start_redis(work / "redis", appendonly=False)
    endpoint = ScriptedMessages()
    proxy = new_server()
    try:
        port = await endpoint.start()
        proxy_pb2_grpc.add_ProxyServicer_to_server(CredentialsOnlyProxy(f"http://127.0.0.1:{port}"), proxy)  # type: ignore[abstract]
        proxy_port = bind(proxy, "127.0.0.1:0")
        await proxy.start()
        urls = {"nats": nats.url, "redis": redis_server.url}
        results = {
            s: await phase(s, task, executions, concurrency, group_size, work, urls, proxy_port)
            for s in starts
        }
    finally:
        await proxy.stop(0)
        await endpoint.stop()
        nats.stop()
        redis_server.stop()
    main_start = "fork" if "fork" in results else starts[0]
    out: dict[str, Any] = {k: v for k, v in results[main_start].items() if k != "fork_server_preload_cpu_s"}
    if "plain" in results and main_start != "plain":
        out.update(
            {
                f"{k}_plain": v
                for k, v in results["plain"].items()
                if k
                in (
                    "cpu_s_per_execution",
                    "harness_cpu_s_per_execution",
                    "children_cpu_s_per_execution",
                    "executions_per_min",
                    "wall_s",
                )
            }
        )
        out["cpu_ratio_plain_vs_fork"] = round(
            out["cpu_s_per_execution_plain"] / out["cpu_s_per_execution"], 2
        )
    out.update(
        start=main_start,
        starts=starts,
        task=task,
        executions=executions,
        max_concurrent=concurrency,
        fork_server_preload_cpu_s=results.get("fork", {}).get("fork_server_preload_cpu_s"),
        model_calls=endpoint.requests,
        cpu_count=os.cpu_count(),
        load_avg_1m=round(os.getloadavg()[0], 2),
        regime="CPU stack: this machine's cores, shared by every process of the run",
    )
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench harness", description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--task", choices=("demo", "trivial", "harbor"), default="demo")
    parser.add_argument(
        "--start",
        choices=("both", "fork", "plain"),
        default=None,
        help="how the harness starts (demo: both by default, plain, then fork, in one run)",
    )
    args = parser.parse_args(argv)
    if args.start is None:
        args.start = "both" if args.task == "demo" else "plain"
    elif args.task != "demo" and args.start != "plain":
        parser.error(
            f"--start {args.start}: the {args.task} task's harness is not a `python -m` module; use plain"
        )
    starts = ["plain", "fork"] if args.start == "both" else [args.start]
    run_bench(
        "harness",
        lambda work: run(args.task, starts, args.executions, args.concurrency, args.group_size, work),
    )
