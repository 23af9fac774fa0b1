"""Benchmark of the proxy: the time a call spends in it, measured against calling the engine directly
in the same run, on a short history and on an 800 KB Claude-Code-shaped one, and its throughput.

    gyre bench proxy [--small-samples N] [--large-samples N] [--concurrency N] [--history-kb N]
    gyre bench proxy --backend sglang [--sglang-samples N]

Three processes: the real proxy service (`python -m services.proxy`, with NATS and Redis), an
embedded engine with scripted outputs (`python -m services.cell_agent.engine`; a short answer, so
engine time is small and stable), and this process as the harness. Each proxy call (Anthropic
Messages, non-streaming) is followed by a direct engine call with the very prompt ids the proxy
sent (rebuilt with a mirror of the execution's tree); overhead = proxy latency - direct latency,
pair by pair. The 800 KB history is a Claude Code conversation (billing line, system prompt, 12
tools, text + tool_use turns, tool results) that grows by one exchange per call, as a live
execution does.

Prints one JSON object (last line):
    overhead_ms_p50_small, overhead_ms_p99_small    short history (goal: p50 <= 2 ms)
    overhead_ms_p50_800kb                           800 KB history (goal: <= 20 ms)
    overhead_ratio_800kb_vs_small                   p50 800 KB / p50 small
    requests_per_s                                  proxy calls/s with `concurrency` executions
    direct_requests_per_s                           engine calls/s at the same concurrency
    direct_ms_p50_small, direct_ms_p50_800kb        the engine-only latencies the overheads subtract

`--backend sglang`: the engine is the real SGLang (`make setup`'s .venv-sglang, on this CPU, float32)
serving the same model, which generates (no script): each proxy call on a short history is followed by
its direct twin, one execution at a time (b1) and 16 at once (b16). The twin is the same engine work as
the proxy's call: the request the proxy sends SGLang (not streamed, with `return_logprob`; log-probs are
the engine's work, and the proxy must record them), on the same prompt ids, for as many output tokens
(`ignore_eos`), the prompt put in SGLang's prefix cache before either, and both sent through the same
HTTP/1.1 client (`TwinBench`). So the difference is the proxy's own overhead — its HTTP server, its
tree and encoding work, recording into Redis, and the extra process hop — as a share of SGLang's own
call latency (goal <= 5%):
    sglang.overhead_share_b1 / _b16       median(proxy - direct) / median(direct)
    sglang.overhead_ms_p50_b1 / _b16, sglang.direct_ms_p50_b1 / _b16, sglang.samples_b1 / _b16
    sglang.proxy_overhead_ms_mean_b1 / _b16   the proxy's own `overhead_seconds` histogram, mean per call
    sglang.proxy_cpu_ms_per_call_b1 / _b16    the proxy process's CPU per call
    sglang.twin_request                   the shape of the twin (and of the proxy's request)
At b16 the 16 loops run nearly in step (most outputs stop at `max_tokens`), so the proxy, one event
loop, gets its calls in bursts and works through each burst one call after another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import orjson
import psutil
from prometheus_client.parser import text_string_to_metric_families

from app.stack.servers import ServerProcess, start_nats, start_redis
from bench._startup import bench_model, run_bench, start_engine_and_proxy, start_proxy, stop_processes
from gyre.config.engine import EngineSection
from gyre.engine import EngineClient
from gyre.engine.http1 import Http1Pool
from gyre.paths import REPO_ROOT
from gyre.rpc import aio_channel
from gyre.trajectory import CallMeta, TrajectoryTree, from_anthropic, get_profile, template_for_family
from gyre.trajectory.templates import template_for_model
from gyre.v1 import common_pb2, proxy_pb2, proxy_pb2_grpc

OVERHEAD_SERIES = "gyre_proxy_overhead_seconds"
OUTPUT = "Done.<|im_end|>"
OUTPUT_IDS = [*b"Done.", 258]
TOOLS = [
    "Agent",
    "Bash",
    "Edit",
    "Glob",
    "Grep",
    "Read",
    "Write",
    "TodoWrite",
    "WebFetch",
    "Skill",
    "Task",
    "ToolSearch",
]


def claude_code_body(history_bytes: int, seed: int) -> dict[str, Any]:
    """A Claude-Code-shaped request whose JSON is about `history_bytes` long."""
    system = [
        {
            "type": "text",
            "text": f"x-anthropic-billing-header: cc_version=2.1.332.{seed:03x}; cc_entrypoint=sdk-cli;",
        },
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {
            "type": "text",
            "text": "You are an interactive agent that helps users with software engineering tasks. " * 90,
        },
    ]
    tools = [
        {
            "name": name,
            "description": f"{name}: "
            + "Use this tool when the task needs it; read the instructions carefully. " * 30,
            "input_schema": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "What to run. " * 20},
                    "description": {"type": "string", "description": "Why, in five words."},
                    "timeout": {"type": "number", "description": "Milliseconds."},
                },
                "required": ["command"],
                "additionalProperties": False,
            },
        }
        for name in TOOLS
    ]
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "<system-reminder>\nAs you answer, use the context below.\n</system-reminder>\n",
                },
                {"type": "text", "text": f"Port the repository to the new API (task {seed})."},
            ],
        }
    ]
    size = len(json.dumps({"system": system, "tools": tools, "messages": messages}))
    turn = 0
    while size < history_bytes:
        call_id = f"toolu_{seed:04x}{turn:06x}"
        assistant = {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Reading module {turn} to see how it uses the old API."},
                {
                    "type": "tool_use",
                    "id": call_id,
                    "name": "Read",
                    "input": {"command": f"src/module_{turn}.py"},
                },
            ],
        }
        body = "".join(f"{i:>6}\tdef function_{turn}_{i}(value):  # uses the old API\n" for i in range(60))
        result = {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": body}],
        }
        messages += [assistant, result]
        size += len(json.dumps(assistant)) + len(json.dumps(result))
        turn += 1
    return {
        "model": "claude-opus-5-5",
        "max_tokens": 32,
        "system": system,
        "tools": tools,
        "messages": messages,
    }


def small_body(seed: int) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 32,
        "system": "You are a helpful coding agent.",
        "tools": [{"name": "Bash", "description": "Run a command.", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": "There are three files."},
            {"role": "user", "content": f"Open file number {seed}."},
        ],
    }


class Execution:
    """One execution from the harness side: its key, its request and a mirror of its tree (to know
    the prompt ids the proxy sends). A growing execution appends each answer and a new user turn
    (a live agent); a short one keeps its history and varies only the last user turn."""

    def __init__(self, key: str, body: dict[str, Any], grows: bool) -> None:
        self.key = key
        self.body = body
        self.grows = grows
        self.tree = TrajectoryTree("mirror", template_for_family("chatml"), get_profile("claude_code"))
        self.turn = 0

    def prompt_ids(self) -> list[int]:
        return cast(list[int], self.tree.prepare(from_anthropic(self.body)).input_ids.tolist())

    def advance(self, content: list[dict[str, Any]]) -> None:
        prepared = self.tree.prepare(from_anthropic(self.body))
        self.tree.commit(prepared, OUTPUT_IDS, [-0.1] * len(OUTPUT_IDS), CallMeta())
        self.turn += 1
        messages = self.body["messages"]
        messages = [*messages, {"role": "assistant", "content": content}] if self.grows else messages[:-1]
        messages = [*messages, {"role": "user", "content": f"Continue with step {self.turn}."}]
        self.body = {**self.body, "messages": messages}


class Bench:
    def __init__(self, base_url: str, engine: EngineClient, http: httpx.AsyncClient) -> None:
        self.base_url = base_url
        self.engine = engine
        self.http = http

    async def proxy_call(self, execution: Execution) -> tuple[float, dict[str, Any]]:
        start = time.perf_counter()
        response = await self.http.post(
            f"{self.base_url}/v1/messages", json=execution.body, headers={"x-api-key": execution.key}
        )
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            raise RuntimeError(f"proxy answered {response.status_code}: {response.text[:300]}")
        return elapsed, response.json()

    async def direct_call(self, ids: list[int]) -> float:
        """The engine alone on `ids`, with the scripted answer's stop rule."""
        params: dict[str, Any] = {"max_new_tokens": 32, "stop_token_ids": [256, 258]}
        start = time.perf_counter()
        await self.engine.generate(ids, params)
        return time.perf_counter() - start

    async def paired(
        self, execution: Execution, samples: int, warmup: int
    ) -> tuple[list[float], list[float]]:
        """(overheads, direct latencies) in seconds; each proxy call is followed by its direct twin."""
        overheads, directs = [], []
        for i in range(warmup + samples):
            ids = execution.prompt_ids()
            proxied, answer = await self.proxy_call(execution)
            direct = await self.direct_call(ids)
            execution.advance(answer["content"])
            if i >= warmup:
                overheads.append(proxied - direct)
                directs.append(direct)
        return overheads, directs

    async def throughput(self, executions: list[Execution], duration_s: float) -> tuple[float, float]:
        """Proxy calls/s and direct engine calls/s with one loop per execution."""
        deadline = time.perf_counter() + duration_s
        counts = [0, 0]

        async def proxy_loop(execution: Execution) -> None:
            while time.perf_counter() < deadline:
                _, answer = await self.proxy_call(execution)
                execution.advance(answer["content"])
                counts[0] += 1

        start = time.perf_counter()
        await asyncio.gather(*(proxy_loop(e) for e in executions))
        proxy_rate = counts[0] / (time.perf_counter() - start)
        prompts = [e.prompt_ids() for e in executions]
        deadline = time.perf_counter() + duration_s

        async def direct_loop(ids: list[int]) -> None:
            while time.perf_counter() < deadline:
                await self.direct_call(ids)
                counts[1] += 1

        start = time.perf_counter()
        await asyncio.gather(*(direct_loop(ids) for ids in prompts))
        return proxy_rate, counts[1] / (time.perf_counter() - start)


class TwinBench:
    """`--backend sglang`: each proxy call and its direct twin, the same engine work through the same client.

    The twin is the request the proxy sends SGLang for a non-streaming harness call (`/generate`, not
    streamed, `return_logprob`, the template's `stop_token_ids`, a `rid`), on the same prompt ids, with
    `ignore_eos` and `max_new_tokens` set to the proxy's output length so that SGLang generates as many
    tokens: computing log-probs is the engine's work, which both sides ask for. Before each pair an
    untimed 1-token call on the prompt ids puts them in SGLang's prefix cache, so the proxied call does
    not pay the prefill of the new turn that its twin, coming second, would find cached. Both calls go
    through the same HTTP/1.1 client (`Http1Pool`; the proxy call with its API key in a header): what
    differs between them is the proxy alone, not the harness's client."""

    def __init__(self, engine: EngineClient, harness: Http1Pool, stop_token_ids: list[int]) -> None:
        self.engine = engine
        self.harness = harness
        self.stop_token_ids = stop_token_ids
        self.num_twins = 0

    async def proxy_call(self, execution: Execution) -> tuple[float, dict[str, Any]]:
        body = orjson.dumps(execution.body)
        start = time.perf_counter()
        status, _, content = await self.harness.request(
            "POST",
            "/v1/messages",
            body,
            "application/json",
            timeout_s=300,
            headers={"x-api-key": execution.key},
        )
        elapsed = time.perf_counter() - start
        if status != 200:
            raise RuntimeError(f"proxy answered {status}: {content[:300]!r}")
        return elapsed, cast(dict[str, Any], orjson.loads(content))

    async def twin_call(self, ids: list[int], output_tokens: int) -> float:
        self.num_twins += 1
        params = {"stop_token_ids": self.stop_token_ids, "max_new_tokens": output_tokens, "ignore_eos": True}
        start = time.perf_counter()
        await self.engine.generate(ids, params, rid=f"twin-{self.num_twins}")
        return time.perf_counter() - start

    async def twinned(self, execution: Execution, rounds: int) -> tuple[list[float], list[float]]:
        """(overheads, direct latencies): each proxy call, then its twin (the class docstring)."""
        overheads, directs = [], []
        for _ in range(rounds):
            ids = execution.prompt_ids()
            await self.engine.generate(ids, {"max_new_tokens": 1}, return_logprob=False)  # into the cache
            proxied, answer = await self.proxy_call(execution)
            direct = await self.twin_call(ids, int(answer["usage"]["output_tokens"]))
            execution.advance(answer["content"])
            overheads.append(proxied - direct)
            directs.append(direct)
        return overheads, directs


class ProxyGauge:
    """What the proxy itself says about a phase of calls: its `overhead_seconds` histogram (time in the
    proxy's own code, engine and harness waits excluded) and the CPU its process used."""

    def __init__(self, harness: Http1Pool, pid: int) -> None:
        self.harness = harness
        self.process = psutil.Process(pid)

    async def read(self) -> tuple[float, float, float]:
        """(overhead seconds summed, calls observed, process CPU seconds)."""
        _, _, content = await self.harness.request("GET", "/metrics", None, None, timeout_s=30)
        total = count = 0.0
        for family in text_string_to_metric_families(content.decode()):
            for sample in family.samples:
                if sample.name == OVERHEAD_SERIES + "_sum":
                    total += sample.value
                elif sample.name == OVERHEAD_SERIES + "_count":
                    count += sample.value
        times = self.process.cpu_times()
        return total, count, float(times.user + times.system)

    @staticmethod
    def per_call_ms(
        before: tuple[float, float, float], after: tuple[float, float, float]
    ) -> dict[str, float]:
        calls = max(1.0, after[1] - before[1])
        return {
            "proxy_overhead_ms_mean": _ms((after[0] - before[0]) / calls),
            "proxy_cpu_ms_per_call": _ms((after[2] - before[2]) / calls),
        }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    nats: ServerProcess = start_nats(workdir / "nats")
    redis: ServerProcess = start_redis(workdir / "redis", appendonly=False)
    processes: list[subprocess.Popen[bytes]] = []
    script_file = workdir / "script.jsonl"
    script_file.write_text(json.dumps({"text": OUTPUT}) + "\n")
    try:
        config = {
            "run": {"id": "benchproxy", "dir": str(workdir / "runs")},
            "nats": {"url": nats.url},
            "redis": {"url": redis.url},
            "log": {"level": "warning", "format": "json"},
            "model": {"path": str(bench_model(workdir / "model"))},
            # One scripted answer, served again whenever the queue runs dry: however many calls a phase
            # makes (the throughput runs make as many as the machine allows), none finds the queue empty.
            "cell_agent": {
                "engine": {
                    "output_source": "scripted",
                    "max_batch_size": 128,
                    "script_file": str(script_file),
                    "script_repeat": True,
                }
            },
        }
        engine_url, endpoint = await start_engine_and_proxy(workdir, config, processes)
        async with (
            aio_channel(f"127.0.0.1:{endpoint['grpc_port']}") as channel,
            EngineClient(engine_url, timeout_s=300) as engine,
            httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=256)) as http,
        ):
            stub = proxy_pb2_grpc.ProxyStub(channel)
            await stub.UpdateRoutes(
                proxy_pb2.UpdateRoutesRequest(
                    engines=[common_pb2.EngineEndpoint(engine_id="cell-0", url=engine_url, cell=0)],
                    default_engine_id="cell-0",
                )
            )

            async def open_execution(name: str, body: dict[str, Any], grows: bool = False) -> Execution:
                response = await stub.OpenExecution(
                    proxy_pb2.OpenExecutionRequest(
                        execution=common_pb2.ExecutionRef(execution_id=name), profile="claude_code"
                    )
                )
                return Execution(response.api_key, body, grows)

            bench = Bench(endpoint["base_url"], engine, http)
            small_overheads, small_directs = await bench.paired(
                await open_execution("small", small_body(0)), args.small_samples, warmup=20
            )
            large_body = claude_code_body(args.history_kb * 1024, seed=1)
            large_overheads, large_directs = await bench.paired(
                await open_execution("large", large_body, grows=True), args.large_samples, warmup=2
            )
            executions = [await open_execution(f"c{i}", small_body(i)) for i in range(args.concurrency)]
            proxy_rate, direct_rate = await bench.throughput(executions, args.duration_s)
    finally:
        stop_processes(processes)
        nats.stop()
        redis.stop()
    p50_small = statistics.median(small_overheads)
    p50_large = statistics.median(large_overheads)
    return {
        "overhead_ms_p50_small": _ms(p50_small),
        "overhead_ms_p99_small": _ms(_percentile(small_overheads, 0.99)),
        "overhead_ms_p50_800kb": _ms(p50_large),
        "overhead_ratio_800kb_vs_small": round(p50_large / p50_small, 2) if p50_small > 0 else None,
        "requests_per_s": round(proxy_rate, 1),
        "direct_requests_per_s": round(direct_rate, 1),
        "direct_ms_p50_small": _ms(statistics.median(small_directs)),
        "direct_ms_p50_800kb": _ms(statistics.median(large_directs)),
        "history_bytes_800kb": len(json.dumps(large_body)),
        "concurrency": args.concurrency,
        "samples_small": len(small_overheads),
        "samples_800kb": len(large_overheads),
    }


async def run_sglang(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The proxy in front of the real SGLang (see the module docstring and `TwinBench`)."""
    from services.cell_agent.engine_hosts import create_engine_host

    python = REPO_ROOT / ".venv-sglang" / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"gyre bench proxy: SGLang is not installed ({python} is missing): run `make setup`")
    nats: ServerProcess = start_nats(workdir / "nats")
    redis: ServerProcess = start_redis(workdir / "redis", appendonly=False)
    processes: list[subprocess.Popen[bytes]] = []
    model = bench_model(workdir / "model")
    section = EngineSection(
        backend="sglang",
        sglang_device="cpu",
        sglang_python=str(python),
        dtype="float32",
        max_batch_size=32,
        kv_cache_tokens=32768,
        sglang_args=["--context-length", "32768"],
    )
    host = create_engine_host(section, model)
    phases: dict[str, tuple[list[float], list[float], dict[str, float]]] = {}
    harness: Http1Pool | None = None
    try:
        await host.start()
        config = {
            "run": {"id": "benchproxy", "dir": str(workdir / "runs")},
            "nats": {"url": nats.url},
            "redis": {"url": redis.url},
            "log": {"level": "warning", "format": "json"},
            "model": {"path": str(model)},
        }
        endpoint = await start_proxy(workdir, config, processes)
        proxy_url = urlsplit(endpoint["base_url"])
        harness = Http1Pool(proxy_url.hostname or "127.0.0.1", proxy_url.port or 80, connect_timeout_s=5)
        async with (
            aio_channel(f"127.0.0.1:{endpoint['grpc_port']}") as channel,
            EngineClient(host.url, timeout_s=300) as engine,
        ):
            stub = proxy_pb2_grpc.ProxyStub(channel)
            await stub.UpdateRoutes(
                proxy_pb2.UpdateRoutesRequest(
                    engines=[common_pb2.EngineEndpoint(engine_id="cell-0", url=host.url, cell=0)],
                    default_engine_id="cell-0",
                )
            )

            async def open_execution(name: str, seed: int) -> Execution:
                response = await stub.OpenExecution(
                    proxy_pb2.OpenExecutionRequest(
                        execution=common_pb2.ExecutionRef(execution_id=name), profile="claude_code"
                    )
                )
                return Execution(response.api_key, small_body(seed), grows=False)

            stop_token_ids = sorted(template_for_model(model).stop_token_ids)
            bench = TwinBench(engine, harness, stop_token_ids)
            gauge = ProxyGauge(harness, processes[-1].pid)
            await bench.twinned(await open_execution("warm", 0), 3)
            b1_execution = await open_execution("b1", 1)
            before = await gauge.read()
            overheads, directs = await bench.twinned(b1_execution, args.sglang_samples)
            phases["b1"] = overheads, directs, ProxyGauge.per_call_ms(before, await gauge.read())
            executions = [await open_execution(f"b16-{i}", 100 + i) for i in range(16)]
            rounds = max(1, args.sglang_samples // 8)
            before = await gauge.read()
            b16_runs = await asyncio.gather(*(bench.twinned(e, rounds) for e in executions))
            phases["b16"] = (
                [o for run, _ in b16_runs for o in run],
                [d for _, run in b16_runs for d in run],
                ProxyGauge.per_call_ms(before, await gauge.read()),
            )
    finally:
        if harness is not None:
            await harness.aclose()
        stop_processes(processes)
        await host.stop()
        nats.stop()
        redis.stop()
    out: dict[str, Any] = {}
    for name, (overheads, directs, proxy_says) in phases.items():
        overhead, direct = statistics.median(overheads), statistics.median(directs)
        out |= {
            f"overhead_share_{name}": round(overhead / direct, 4),
            f"overhead_ms_p50_{name}": _ms(overhead),
            f"direct_ms_p50_{name}": _ms(direct),
            f"samples_{name}": len(overheads),
        }
        out |= {f"{key}_{name}": value for key, value in proxy_says.items()}
    out["twin_request"] = {
        "path": "/generate",
        "stream": False,
        "return_logprob": True,
        "sampling_params": ["stop_token_ids", "max_new_tokens", "ignore_eos"],
        "rid": True,
        "prefix_cached": True,
    }
    return {"backend": "sglang", "sglang": out}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["embedded", "sglang"], default="embedded")
    parser.add_argument(
        "--sglang-samples", type=int, default=40, help="--backend sglang: twinned calls at b1 (b16: 16 x N/8)"
    )
    parser.add_argument("--small-samples", type=int, default=300, help="paired calls on the short history")
    parser.add_argument("--large-samples", type=int, default=30, help="paired calls on the 800 KB history")
    parser.add_argument("--history-kb", type=int, default=800, help="size of the long history's JSON")
    parser.add_argument("--concurrency", type=int, default=64, help="executions calling at once (throughput)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="length of each throughput run")
    args = parser.parse_args(argv)
    run_bench("proxy", lambda work: (run_sglang if args.backend == "sglang" else run)(args, work))


if __name__ == "__main__":
    main(sys.argv[1:])
