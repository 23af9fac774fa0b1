"""`gyre bench sandbox`: what each sandbox launcher costs an execution, in one run, on a Harbor task with
its own image (examples/tasks/fix-sum: FROM the local Debian base, a RUN step, a COPY).

    gyre bench sandbox [--launchers process,isolated,container] [--executions 8] [--concurrency 4] [--json]
    gyre bench sandbox --launchers process --executions 2 --concurrency 1 --no-build   # the tiny size
                       [--uid-base 194000]    # sandbox uids of its own (the evaluator's 1000 above)

Real nats-server and redis-server on loopback, the runner and the evaluator in-process with each
launcher in turn, a proxy that only hands out credentials (one key per execution) pointing at a
scripted endpoint that records when each execution's first model call arrives. The harness is a bash
script (`HARNESS`): one model call over the base URL it was given, then the fix; so what is measured
is the sandbox, not an agent. `isolated` and `container` need root; `container` an engine
(deploy/local/containers.sh).

Per launcher:

    first_call_s_p50 / _p90       start request published (when a runner slot is free) → the harness's
                                  first model call arrives
    started_s_p50                 start request published → ExecutionStarted received (the runner's part:
                                  claim, workspace, credentials, the sandbox's launch)
    cpu_s_per_execution           sandbox + engine + runner CPU, each also given alone:
    sandbox_cpu_s_per_execution     inside the sandbox (status.json `sandbox_cpu_s`: the supervisor and
                                    everything it ran, or the container's cgroup up to the harness's end)
    engine_cpu_s_per_execution      the engine's API service and the processes it waited for, and podman's
                                    conmon processes with the runc runs they start (their cgroup, shared
                                    with every other podman user of the host: quote it from a quiet one)
    runner_cpu_s_per_execution      this process (runner, evaluator and the bench) and its waited children
    verifier_s_p50                termination → evaluation (the verifier's attempt: in the execution's
                                  container for `container`, its copies in and out included)
    reward_mean                   fix-sum's test.sh: 1 in its image, 0 on the host (no check-sum there)

And once: `image_build_cold_s` (fix-sum's Dockerfile with a fresh first layer: every step runs),
`image_build_cached_s` (the same task in a new runner: its digest's image is there, nothing is built),
`image_build_layer_cache_s` (built again through the engine's layer cache), and
`container_over_isolated_first_call_s_p50`, and the machine's load average at the start and the end (the
figures move with it on a shared machine). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import psutil

from app.stack.servers import start_nats, start_redis
from bench._scripted_messages import ScriptedMessages
from bench._startup import run_bench
from gyre.bus import EventBus, decode_event
from gyre.bus.codec import TYPE_HEADER
from gyre.config import load_config
from gyre.paths import REPO_ROOT
from gyre.sandbox.host import remove_run_sandboxes
from gyre.store import Counters, ExecutionRecord, GroupRecord, Keys, Records, connect_redis
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from gyre.v1 import proxy_pb2, proxy_pb2_grpc

EXAMPLE = REPO_ROOT / "examples" / "tasks" / "fix-sum"
TASK = "tasks/fix-sum"
HARNESS = r"""
hp=${ANTHROPIC_BASE_URL#http://}; hp=${hp%%/*}
body='{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"fix sum.sh"}]}'
exec 3<>"/dev/tcp/${hp%:*}/${hp##*:}"
printf 'POST /v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s' \
  "$hp" "$ANTHROPIC_API_KEY" "${#body}" "$body" >&3
cat <&3 > reply.txt
sed -i 's/$1 - $2/$1 + $2/' sum.sh
"""


class KeyPerExecution(proxy_pb2_grpc.ProxyServicer):
    """OpenExecution / CloseExecution only: the endpoint's URL, and the execution id as its key."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    async def OpenExecution(self, request: Any, context: Any) -> proxy_pb2.OpenExecutionResponse:
        return proxy_pb2.OpenExecutionResponse(base_url=self.base_url, api_key=request.execution.execution_id)

    async def CloseExecution(self, request: Any, context: Any) -> proxy_pb2.CloseExecutionResponse:
        return proxy_pb2.CloseExecutionResponse()


CONMON_CGROUP = Path("/sys/fs/cgroup/cpuacct/libpod_parent/conmon/cpuacct.usage")
"""podman's conmon processes and the runc runs they start (cgroup v1, cgroupfs manager)."""


def _engine_cpu_s() -> float:
    """CPU seconds of the container engine: its API service (and what it waited for) and, for podman,
    every conmon and the runc processes they start (their cgroup); 0 without an engine."""
    total = float(CONMON_CGROUP.read_text()) / 1e9 if CONMON_CGROUP.exists() else 0.0
    for p in psutil.process_iter(["name", "cmdline"]):
        cmdline = p.info["cmdline"] or []
        if (p.info["name"] == "podman" and "service" in cmdline) or p.info["name"] == "dockerd":
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
    return total


def _own_cpu_s() -> float:
    return sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def _pct(values: list[float], q: float) -> float:
    """The median for q = 0.5, else the nearest-rank quantile."""
    if q == 0.5:
        return round(statistics.median(values), 3)
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))], 3)


class Dispatch:
    """One group per execution (of one member each), started `concurrency` at a time: a start request is
    published when a runner slot is free (at first, and at each termination), so the time from it to the
    first model call is the sandbox's start, not a wait in the queue. Execution ids carry `prefix` (the
    launcher): they are the keys the endpoint records first calls under."""

    def __init__(self, bus: EventBus, redis: Any, keys: Keys, executions: int, prefix: str) -> None:
        self.bus, self.redis, self.keys = bus, redis, keys
        self.waiting = [f"{prefix}-e{i}" for i in range(executions)]
        self.published: dict[str, float] = {}

    async def next(self) -> None:
        if not self.waiting:
            return
        eid = self.waiting.pop(0)
        gid = f"{eid}-g"
        group = GroupRecord(gid, TASK, TASK, (eid,), 0, 0, int(time.time() * 1000))
        await Records(self.redis, self.keys).put_group(
            group, [ExecutionRecord(eid, gid, 0, TASK, TASK, 0, 0)]
        )
        await Counters(self.redis, self.keys).add("dispatched", 1)
        self.published[eid] = time.time()
        await self.bus.publish(
            ev.ExecutionStartRequested(
                execution=cm.ExecutionRef(execution_id=eid, group_id=gid, index_in_group=0, query_id=TASK),
                task_id=TASK,
                engine_id="cell-0",
            )
        )


async def phase(
    launcher: str,
    executions: int,
    concurrency: int,
    work: Path,
    urls: dict[str, str],
    proxy_port: int,
    calls: ScriptedMessages,
    uid_base: int,
) -> dict[str, Any]:
    """A runner and an evaluator with `launcher` over `executions` executions of fix-sum."""
    from services.evaluator.service import EvaluatorService
    from services.runner.service import RunnerService

    run_id = f"bsbx{launcher[:3]}{uuid.uuid4().hex[:6]}"
    box = {"isolation": launcher, "kill_grace_s": 1.0}
    config = load_config(
        None,
        environ={},
        overrides={
            "run": {"id": run_id, "dir": str(work / "runs")},
            "nats": {"url": urls["nats"]},
            "redis": {"url": urls["redis"]},
            "proxy": {"port": proxy_port},
            "log": {"level": "warning"},
            "tasks": {"dirs": [str(work / "tasks")]},
            # uids of its own (--uid-base), apart from those of tests and stacks on the same machine
            "runner": {
                "harness": "command",
                "command": ["bash", "-c", HARNESS],
                "max_concurrent": concurrency,
                "sandbox": {**box, "uid_base": uid_base},
            },
            "evaluator": {"max_concurrent": concurrency, "sandbox": {**box, "uid_base": uid_base + 1000}},
        },
    )
    bus = await EventBus.connect(urls["nats"], run_id, "bench")
    redis = await connect_redis(urls["redis"])
    times: dict[str, dict[str, Any]] = {}
    started: dict[str, float] = {}
    done = asyncio.Event()
    dispatch = Dispatch(bus, redis, Keys(run_id), executions, launcher)

    async def on_msg(msg: Any) -> None:
        event = decode_event((msg.headers or {}).get(TYPE_HEADER, ""), msg.data)
        if isinstance(event, ev.ExecutionStarted):
            started[event.execution.execution_id] = time.time()
        if isinstance(event, ev.ExecutionTerminated | ev.EvaluationDone):
            times.setdefault(event.execution.execution_id, {})[type(event).__name__] = event
            if isinstance(event, ev.ExecutionTerminated):
                await dispatch.next()
            if sum(len(t) for t in times.values()) == 2 * executions:
                done.set()

    await bus.nc.subscribe(f"gyre.{run_id}.>", cb=on_msg)
    own_before, engine_before = _own_cpu_s(), _engine_cpu_s()
    try:
        async with RunnerService(config), EvaluatorService(config):
            for _ in range(min(concurrency, executions)):
                await dispatch.next()
            await asyncio.wait_for(done.wait(), timeout=900)
    finally:
        # The run ends here, as `gyre down` ends one: every container it kept goes. The evaluator removes
        # an execution's container after publishing its EvaluationDone, so the last one's removal is still
        # under way when the last EvaluationDone arrives, and stopping the evaluator cancels it.
        await asyncio.to_thread(remove_run_sandboxes, config)
    published = dispatch.published
    own_s, engine_s = _own_cpu_s() - own_before, _engine_cpu_s() - engine_before
    await bus.close()
    await redis.aclose()
    return _phase_result(
        config.run.path, times, published, started, calls, own_s, engine_s if launcher == "container" else 0.0
    )


def _phase_result(
    run_dir: Path,
    times: dict[str, dict[str, Any]],
    published: dict[str, float],
    started: dict[str, float],
    calls: ScriptedMessages,
    own_s: float,
    engine_s: float,
) -> dict[str, Any]:
    n = len(published)
    statuses = [json.loads(p.read_text()) for p in run_dir.glob("sandboxes/*/control/status.json")]
    failed = [
        t["ExecutionTerminated"].detail
        for t in times.values()
        if t["ExecutionTerminated"].reason != cm.TERMINATION_REASON_COMPLETED
    ]
    if failed or len(statuses) != n:
        raise RuntimeError(
            f"{len(failed)} of {n} executions failed ({len(statuses)} statuses), e.g. {failed[:1]}"
        )
    first = [calls.first_call[eid] - published[eid] for eid in published]
    launched = [started[eid] - published[eid] for eid in published]
    verifier = [
        (t["EvaluationDone"].meta.emitted_at_ms - t["ExecutionTerminated"].meta.emitted_at_ms) / 1000
        for t in times.values()
    ]
    sandbox_s = statistics.fmean(float(s.get("sandbox_cpu_s") or 0.0) for s in statuses)
    return {
        "first_call_s_p50": _pct(first, 0.5),
        "first_call_s_p90": _pct(first, 0.9),
        "started_s_p50": _pct(launched, 0.5),
        "cpu_s_per_execution": round(sandbox_s + (engine_s + own_s) / n, 3),
        "sandbox_cpu_s_per_execution": round(sandbox_s, 3),
        "engine_cpu_s_per_execution": round(engine_s / n, 3),
        "runner_cpu_s_per_execution": round(own_s / n, 3),
        "verifier_s_p50": _pct(verifier, 0.5),
        "reward_mean": round(statistics.fmean(t["EvaluationDone"].reward for t in times.values()), 3),
    }


async def builds(work: Path) -> dict[str, float]:
    """fix-sum's image built cold (a fresh first layer), then as a run finds it (its digest's image is
    there), then again through the engine's layer cache; the images made here are removed."""
    from gyre.config.runner import SandboxSection
    from gyre.sandbox.containers.images import Images
    from gyre.tasks.directory import DirectorySuite

    tasks = work / "build-tasks"
    shutil.copytree(EXAMPLE, tasks / "fix-sum")
    dockerfile = tasks / "fix-sum" / "environment" / "Dockerfile"
    lines = dockerfile.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("FROM")) + 1
    lines.insert(at, f"LABEL gyre.bench={uuid.uuid4().hex}")
    dockerfile.write_text("\n".join(lines) + "\n")
    task = DirectorySuite(tasks).get("fix-sum")
    images = Images.of_engine(SandboxSection(), work / "builds")
    image = await images.reference(task)
    try:
        cold = await images.build(task)
        # as a runner that starts afterwards finds it: a new process, the engine asked once
        cached = await Images.of_engine(SandboxSection(), work / "builds").build(task)
        layers = await images.build(task, force=True)
        assert not cold.cached and cached.cached and not layers.cached
    finally:
        images.remove(image)
    return {
        "image_build_cold_s": round(cold.seconds, 2),
        "image_build_cached_s": round(cached.seconds, 3),
        "image_build_layer_cache_s": round(layers.seconds, 2),
    }


async def prebuild(work: Path) -> None:
    """fix-sum's image, so that the container phase measures starts, not the build."""
    from gyre.config.runner import SandboxSection
    from gyre.sandbox.containers.images import Images
    from gyre.tasks.directory import DirectorySuite

    images = Images.of_engine(SandboxSection(), work / "builds")
    await images.ensure(DirectorySuite(work / "tasks").get("fix-sum"))


@contextlib.asynccontextmanager
async def stand_ins(work: Path) -> AsyncIterator[tuple[dict[str, str], int, ScriptedMessages]]:
    """Real nats-server and redis-server on loopback, a scripted model endpoint and a proxy that only hands
    out its URL with one key per execution: ({"nats", "redis"} URLs, the proxy's gRPC port, the endpoint)."""
    nats, redis_server = start_nats(work / "nats"), start_redis(work / "redis", appendonly=False)
    calls = ScriptedMessages(tool_call=False)
    proxy = grpc.aio.server()
    try:
        port = await calls.start()
        proxy_pb2_grpc.add_ProxyServicer_to_server(KeyPerExecution(f"http://127.0.0.1:{port}"), proxy)  # type: ignore[abstract]
        proxy_port = proxy.add_insecure_port("127.0.0.1:0")
        await proxy.start()
        yield {"nats": nats.url, "redis": redis_server.url}, proxy_port, calls
    finally:
        await proxy.stop(0)
        await calls.stop()
        nats.stop()
        redis_server.stop()


async def run(
    launchers: list[str], executions: int, concurrency: int, build: bool, uid_base: int, work: Path
) -> dict[str, Any]:
    shutil.copytree(EXAMPLE, work / "tasks" / "fix-sum")
    out: dict[str, Any] = {
        "executions": executions,
        "concurrency": concurrency,
        "task": TASK,
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
    }
    if build and "container" in launchers:
        out.update(await builds(work))
    if "container" in launchers:
        await prebuild(work)
    async with stand_ins(work) as (urls, proxy_port, calls):
        for name in launchers:
            out[name] = await phase(name, executions, concurrency, work, urls, proxy_port, calls, uid_base)
    out["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    if "container" in out and "isolated" in out:
        out["container_over_isolated_first_call_s_p50"] = round(
            out["container"]["first_call_s_p50"] - out["isolated"]["first_call_s_p50"], 3
        )
    return out


def main(argv: list[str] | None = None) -> None:
    default = "process,isolated,container" if os.geteuid() == 0 else "process"
    parser = argparse.ArgumentParser(prog="gyre bench sandbox", description=__doc__.split("\n")[0])
    parser.add_argument("--launchers", default=default, help=f"comma-separated (default {default})")
    parser.add_argument("--executions", type=int, default=8, help="executions per launcher")
    parser.add_argument("--concurrency", type=int, default=4, help="executions at once")
    parser.add_argument("--no-build", action="store_true", help="skip the image build measurements")
    parser.add_argument("--uid-base", type=int, default=194000, help="sandbox uids (the evaluator's +1000)")
    parser.add_argument("--json", action="store_true", help="accepted; the last line is always JSON")
    args = parser.parse_args(argv)
    launchers = [name.strip() for name in args.launchers.split(",") if name.strip()]
    if args.executions < 1 or args.concurrency < 1:
        parser.error("--executions and --concurrency must be at least 1")
    run_bench(
        "sandbox",
        lambda work: run(
            launchers, args.executions, args.concurrency, not args.no_build, args.uid_base, work
        ),
    )
