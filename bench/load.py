"""Load benchmark: many concurrent synthetic executions against the real proxy, the run's bus and Redis,
with each step's groups archived out of Redis as the packer does once a step committed.

    gyre bench load [--concurrency 64,256,1152] [--turns 4] [--steps 12] [--tool-s 10.9] [--json]

Processes: nats-server, redis-server (on its AOF with a run's fsync policy; `--aof` to change), an
embedded engine with scripted outputs and the real proxy service (`python -m services.proxy`), on a model with the BPE tokenizer of `gyre model init` (8,192
ids; ~3.9 bytes per token on the harness's prompt, ~2.2 on tool output — a real model's density, where
the demo's byte tokenizer makes every byte a token); this process plays the scheduler's records, the runners'
harnesses and the evaluator. One *step* = `concurrency` executions in groups of `group-size`: their
records are written (as the scheduler does), each is opened on the proxy, calls it `turns` times with a
Claude-Code-shaped history that grows by a tool exchange per turn, is closed, gets an outcome (as the
evaluator does), its group is claimed for the step's batch and `StepArchiver.archive_step` archives
and deletes the batch (as the packer does on `StepCompleted`).

Two kinds of step. `--steps` *saturated* steps at `--flat-concurrency` (default: the first level) call back
to back, with no tool time: the proxy's throughput, and the flatness of Redis memory over steps. Then one
*paced* step at each level: before each call a harness runs a tool for an exponentially distributed time
of mean `--tool-s` — 10.9 s by default, the paper's rate (1.93 h per execution, 636 calls in its Appendix C
execution), so 1,152 executions send ~105 calls/s: the latency a harness sees at the paper's load.
The harnesses speak HTTP/1.1 over bare asyncio streams (one keep-alive connection each), and the proxy
runs alone on the first CPU, every other process of the bench on the rest (`--no-pin`: no affinity), so
that on this machine's two cores the engine and the harnesses do not take the proxy's CPU.

Per execution, `ExecutionStarted` and `ExecutionTerminated` are published on the run's JetStream bus
and read by a durable consumer over the scheduler's subjects; `events_per_s` is that consumer's rate.
The scheduler's policy itself is not run here (it needs cells); this measures the bus path its events take.

Prints one JSON object (last line):
    by_concurrency.{C}.proxy_overhead_ms_p50/p99   paced: time in the proxy excluding engine and client
                                                   waits, from the proxy's own histogram (interpolated in
                                                   buckets); p99 is the highest of the level's steps
    by_concurrency.{C}.client_ms_p50/p99           harness-seen latency of a call (includes the engine)
    by_concurrency.{C}.client_ms_p99_by_turn       the same p99 per turn (turn 0: each execution's first call)
    by_concurrency.{C}.errors, .calls, .calls_per_s
    by_concurrency.{C}.cpu_ms_per_call.{proxy,engine,harnesses}   CPU of each process per answered call
                                                   (opening, closing and archiving included)
    by_concurrency.{C}.proxy_cpu_busy              the proxy's CPU seconds per wall second
    saturated                                      the same for the saturated steps
    errors, lost                                   non-200 answers; executions whose tree (Redis, then the
                                                   archive) does not hold every answered call
    events_per_s, redis_bytes_per_execution        Redis growth of one step before archiving / executions
    redis_used_memory_after_step, redis_keys_after_step, used_memory_ratio_last_vs_4   flatness (goal: <= 1.1)
    redis_clients_memory_after_step, used_memory_less_clients_ratio_last_vs_4   the same without the clients'
                                                   buffers (`mem_clients_normal`), which vary with the pools
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import psutil
from prometheus_client.parser import text_string_to_metric_families

from app.stack.servers import ServerProcess, start_nats, start_redis
from bench._startup import bench_model, run_bench, start_engine_and_proxy, stop_processes
from bench.proxy import _ms, _percentile, claude_code_body
from gyre.bus import EventBus
from gyre.config.infra import DEFAULT_APPENDFSYNC
from gyre.ids import batch_id as make_batch_id
from gyre.rpc import aio_channel
from gyre.store import ExecutionRecord, GroupRecord, Keys, Records
from gyre.store.archive import StepArchiver
from gyre.store.connection import connect_redis
from gyre.store.groups import GroupOutcomes, MemberOutcome, OutcomeStatus
from gyre.trajectory.archive import read_archived_tree, tree_path
from gyre.v1 import common_pb2, proxy_pb2, proxy_pb2_grpc
from gyre.v1 import events_pb2 as ev

RUN_ID = "benchload"
OUTPUT = "Reading the module now.<|im_end|>"
OVERHEAD = "gyre_proxy_overhead_seconds"
BROKERS_NICE = -10
TOOL_S = round(1.93 * 3600 / 636, 1)
"""Mean seconds between an execution's calls in the paper: 1.93 h per NL2RepoBench execution (122B) and
636 proxy requests in its Appendix C execution; the scripted engine answers at once, so all of it is tool
time here."""


def _tool_output(execution: int, turn: int, lines: int) -> str:
    return "".join(f"{i:>6}\tdef f_{execution}_{turn}_{i}(value):  # the old API\n" for i in range(lines))


class Connection:
    """One keep-alive HTTP/1.1 connection of a synthetic harness: a bare request writer and response reader
    over asyncio streams. The harnesses share this machine's two cores with the proxy they measure; httpx
    spent ~17 ms of CPU per call here (its pool, its request model, stdlib json), more than the proxy itself."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self.reader is not None and self.reader.at_eof():  # the server closed it while idle (keep-alive)
            await self.close()
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{head}\r\n".encode()
            + body
        )
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the proxy closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":  # the proxy's JSON answers (and errors) carry a length
                raise ValueError(f"unexpected transfer-encoding {value!r} from the proxy")
            elif name == "connection" and value == "close":
                close = True
        data = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Harness:
    """One synthetic execution: a Claude-Code-shaped conversation that grows by one exchange per call, with
    an exponentially distributed tool time (mean `tool_s`; 0: none) before each call."""

    def __init__(
        self, execution_id: str, key: str, body: dict[str, Any], index: int, lines_per_turn: int
    ) -> None:
        self.execution_id = execution_id
        self.key = key
        self.body = body
        self.index = index
        self.lines_per_turn = lines_per_turn
        self.num_answered = 0
        self.latencies_s: list[float] = []
        self.errors: list[str] = []
        self.in_flight = False
        """A call was under way when the step's time ran out (the proxy may have recorded it)."""

    async def run(self, connection: Connection, turns: int, tool_s: float, rng: random.Random) -> None:
        try:
            for turn in range(turns):
                if tool_s > 0:
                    await asyncio.sleep(rng.expovariate(1.0 / tool_s))
                payload = orjson.dumps(self.body)
                start = time.perf_counter()
                self.in_flight = True
                try:
                    status, data = await connection.post("/v1/messages", payload, {"x-api-key": self.key})
                except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                    self.errors.append(f"{type(e).__name__}: {e}")
                    return
                self.in_flight = False
                self.latencies_s.append(time.perf_counter() - start)
                if status != 200:
                    self.errors.append(f"{status}: {data[:200].decode(errors='replace')}")
                    return
                self.num_answered += 1
                content = orjson.loads(data)["content"]
                user = f"Tool output {turn}:\n{_tool_output(self.index, turn, self.lines_per_turn)}"
                self.body = {
                    **self.body,
                    "messages": [
                        *self.body["messages"],
                        {"role": "assistant", "content": content},
                        {"role": "user", "content": user},
                    ],
                }
        finally:
            await connection.close()


def _pin(pin: bool, proxy: int, others: list[int], brokers: list[int]) -> dict[str, Any] | None:
    """With `pin` and two CPUs or more: the proxy alone on the first, every other process of the bench
    (engine, brokers, this one with its harnesses) on the rest — the proxy's own core, as where it runs
    beside GPU engines, rather than a share of the engine's. The brokers (Redis, NATS) run at a higher
    priority than the engine and the harnesses there: in a deployment they have CPUs of their own, and
    the proxy's record write would otherwise wait behind the load generator (at 1,152 executions the
    engine and harnesses need about one core of their own: `cpu_ms_per_call` x `calls_per_s`). Raising a
    priority needs CAP_SYS_NICE; without it they run at the default, and `brokers_nice` says 0."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None
    for pid in (*others, *brokers, os.getpid()):
        _set_affinity(pid, cpus[1:])
    _set_affinity(proxy, cpus[:1])
    nice = BROKERS_NICE
    try:
        for pid in brokers:
            for thread in psutil.Process(pid).threads():  # a nice value is per thread on Linux
                with contextlib.suppress(ProcessLookupError):
                    os.setpriority(os.PRIO_PROCESS, thread.id, nice)
    except PermissionError:
        nice = 0
    return {"proxy": cpus[:1], "engine_brokers_harnesses": cpus[1:], "brokers_nice": nice}


def _set_affinity(pid: int, cpus: list[int]) -> None:
    """Every thread of the process (sched_setaffinity sets one thread; threads started later inherit)."""
    for thread in psutil.Process(pid).threads():
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            os.sched_setaffinity(thread.id, cpus)


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _overhead_buckets(text: str) -> dict[float, float]:
    """Cumulative bucket counts of the proxy's overhead histogram, summed over its `api` label."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == OVERHEAD + "_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return buckets


def _histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """Quantile of the observations between two scrapes, linear within a bucket (Prometheus' rule)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, cumulative
    return lower


class Load:
    def __init__(self, args: argparse.Namespace, workdir: Path, redis_url: str, nats_url: str) -> None:
        self.args = args
        self.workdir = workdir
        self.redis_url = redis_url
        self.nats_url = nats_url
        self.keys = Keys(RUN_ID)
        self.archive_dir = workdir / "runs" / RUN_ID / "archive"
        self.lost: list[str] = []
        self.num_events = 0
        self.events_consumed = 0
        self.num_cut = 0
        """Executions still running when their step's `--step-timeout-s` ran out."""

    async def step(
        self,
        step: int,
        concurrency: int,
        stub: proxy_pb2_grpc.ProxyStub,
        tool_s: float,
        base_url: str,
        bus: EventBus,
        redis: Any,
    ) -> tuple[list[Harness], int]:
        """Run one step's executions, check their trees, archive the batch; returns the harnesses and the
        Redis bytes the step added before it was archived."""
        before = int((await redis.info("memory"))["used_memory"])
        groups = [f"s{step:03d}g{g:04d}" for g in range(concurrency // self.args.group_size)]
        opened = await self._open(step, groups, stub, bus, redis)
        await self._drive(step, opened, tool_s, base_url)
        await self._close(step, opened, stub, bus, redis)
        grown = int((await redis.info("memory"))["used_memory"]) - before
        await self._archive(step, groups, opened, redis)
        return opened, grown

    async def _open(
        self, step: int, groups: list[str], stub: proxy_pb2_grpc.ProxyStub, bus: EventBus, redis: Any
    ) -> list[Harness]:
        """Dispatch the step's groups as the scheduler would and open each execution at the proxy."""
        size, records = self.args.group_size, Records(redis, self.keys)
        initial = claude_code_body(self.args.initial_kb * 1024, seed=step)
        opened: list[Harness] = []
        for g, group_id in enumerate(groups):
            eids = [f"{group_id}-e{i:02d}" for i in range(size)]
            await records.put_group(
                GroupRecord(
                    group_id,
                    "load/q",
                    "load/t",
                    tuple(eids),
                    policy_version=step,
                    burst=0,
                    dispatched_at_ms=int(time.time() * 1000),
                ),
                [
                    ExecutionRecord(e, group_id, i, "load/q", "load/t", 600.0, 1200.0, "claude_code")
                    for i, e in enumerate(eids)
                ],
            )
            for i, eid in enumerate(eids):
                ref = common_pb2.ExecutionRef(
                    execution_id=eid, group_id=group_id, index_in_group=i, query_id="load/q"
                )
                response = await stub.OpenExecution(
                    proxy_pb2.OpenExecutionRequest(
                        execution=ref, profile="claude_code", engine_id="cell-0", policy_version=step
                    )
                )
                body = {**initial, "messages": [*initial["messages"]]}
                opened.append(Harness(eid, response.api_key, body, g * size + i, self.args.lines_per_turn))
                await bus.publish(
                    ev.ExecutionStarted(execution=ref, runner_id="load", engine_id="cell-0"),
                    event_id=f"started:{eid}",
                )
        return opened

    async def _drive(self, step: int, opened: list[Harness], tool_s: float, base_url: str) -> None:
        """Every harness makes its calls; those still running at `--step-timeout-s` are cut and counted."""
        url = urlsplit(base_url)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        rng = random.Random(step)
        tasks = [
            asyncio.create_task(h.run(Connection(host, port), self.args.turns, tool_s, rng)) for h in opened
        ]
        _, pending = await asyncio.wait(tasks, timeout=self.args.step_timeout_s or None)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self.num_cut += sum(
            h.in_flight or (h.num_answered < self.args.turns and not h.errors) for h in opened
        )

    async def _close(
        self, step: int, opened: list[Harness], stub: proxy_pb2_grpc.ProxyStub, bus: EventBus, redis: Any
    ) -> None:
        """Close each execution, check Redis recorded every call the harness got, resolve its outcome."""
        outcomes = GroupOutcomes(redis, self.keys)
        for h in opened:
            await stub.CloseExecution(proxy_pb2.CloseExecutionRequest(execution_id=h.execution_id))
            ref = common_pb2.ExecutionRef(execution_id=h.execution_id, group_id=h.execution_id.split("-")[0])
            await bus.publish(
                ev.ExecutionTerminated(execution=ref, exit_code=0), event_id=f"terminated:{h.execution_id}"
            )
            recorded = await redis.hget(self.keys.tree_meta(h.execution_id), "num_calls")
            if int(recorded or 0) not in _expected_calls(h):
                self.lost.append(
                    f"{h.execution_id}: redis tree has {recorded} calls, harness got {h.num_answered}"
                )
        self.num_events += 2 * len(opened)
        for h in opened:
            status: OutcomeStatus = "valid" if not h.errors else "excluded"
            await outcomes.resolve(
                h.execution_id.split("-")[0],
                self.args.group_size,
                step,
                MemberOutcome(h.execution_id, status, 1.0),
            )

    async def _archive(self, step: int, groups: list[str], opened: list[Harness], redis: Any) -> None:
        """Claim the step's groups as its batch, archive them, and check every tree's archived calls."""
        outcomes = GroupOutcomes(redis, self.keys)
        batch = make_batch_id(RUN_ID, step)
        claimed = await outcomes.claim_ready(len(groups), batch)
        assert len(claimed) == len(groups), f"step {step}: {len(claimed)} of {len(groups)} groups ready"
        await StepArchiver(redis, self.keys, self.archive_dir).archive_step(batch, policy_version=step + 1)
        for h in opened:
            path = tree_path(self.archive_dir, h.execution_id)
            calls = int(read_archived_tree(path).meta.get("num_calls", 0)) if path.exists() else -1
            if calls not in _expected_calls(h):
                self.lost.append(f"{h.execution_id}: archive has {calls} calls, harness got {h.num_answered}")


def _expected_calls(h: Harness) -> tuple[int, ...]:
    """Calls a tree may hold: those the harness got, and one more if a call was cut in flight."""
    return (h.num_answered, h.num_answered + 1) if h.in_flight else (h.num_answered,)


@dataclass
class Measurements:
    """What the steps measured, per concurrency level (`results`) and per step (Redis memory and keys)."""

    results: dict[str, Any] = field(default_factory=dict)
    memory: dict[int, int] = field(default_factory=dict)
    clients_memory: dict[int, int] = field(default_factory=dict)
    """Of `memory`: the connected clients' buffers (how many connections the pools hold, and the
    query buffers of the largest recent commands; Redis shrinks them lazily): noise, not state."""
    num_keys: dict[int, int] = field(default_factory=dict)
    grown_per_execution: list[float] = field(default_factory=list)
    events_consumed: int = 0
    first_event_s: float = 0.0
    last_event_s: float = 0.0
    affinity: dict[str, Any] | None = None

    async def count_event(self, event: object, delivery: object) -> None:
        """The scheduler's side of the bus: count what it would consume, and when."""
        now = time.perf_counter()
        self.first_event_s = self.first_event_s or now
        self.last_event_s = now
        self.events_consumed += 1

    def level_entry(self, key: str, concurrency: int, tool_s: float, cpu_names: Any) -> dict[str, Any]:
        return self.results.setdefault(
            key,
            {
                "concurrency": concurrency,
                "tool_s": tool_s,
                "by_turn": {},
                "errors": 0,
                "calls": 0,
                "wall_s": 0.0,
                "p50": [],
                "p99": [],
                "cpu_s": dict.fromkeys(cpu_names, 0.0),
            },
        )


def _record_step(
    entry: dict[str, Any],
    harnesses: list[Harness],
    wall_s: float,
    cpu_used: dict[str, float],
    overhead: tuple[dict[float, float], dict[float, float]],
) -> None:
    """Add one step's calls, latencies, errors, proxy overhead and CPU to its level's entry."""
    for h in harnesses:
        for turn, x in enumerate(h.latencies_s):
            entry["by_turn"].setdefault(turn, []).append(x)
    entry["errors"] += sum(len(h.errors) for h in harnesses)
    samples = entry.setdefault("error_samples", [])
    samples += [e for h in harnesses for e in h.errors if e not in samples][: max(0, 5 - len(samples))]
    entry["calls"] += sum(h.num_answered for h in harnesses)
    entry["wall_s"] += wall_s
    entry["p50"].append(_histogram_quantile(*overhead, 0.5))
    entry["p99"].append(_histogram_quantile(*overhead, 0.99))
    for name, used in cpu_used.items():
        entry["cpu_s"][name] += used


async def _run_steps(
    args: argparse.Namespace,
    load: Load,
    measured: Measurements,
    plan: list[tuple[int, float, str]],
    stack: dict[str, Any],
) -> None:
    """Each planned step: script the engine, run the step's executions, record what it cost."""
    http, stub, redis, bus = stack["http"], stack["stub"], stack["redis"], stack["bus"]
    engine_url, metrics_url, cpu = stack["engine_url"], stack["metrics_url"], stack["cpu"]
    for step, (concurrency, tool_s, key) in enumerate(plan):
        body = {"entries": [{"text": OUTPUT}] * (concurrency * args.turns), "replace": True}
        (await http.post(f"{engine_url}/gyre/script", json=body)).raise_for_status()
        scrape = _overhead_buckets((await http.get(metrics_url)).text)
        cpu_before = {name: _cpu_s(proc) for name, proc in cpu.items()}
        start = time.perf_counter()
        harnesses, grown = await load.step(step, concurrency, stub, tool_s, stack["base_url"], bus, redis)
        wall_s = time.perf_counter() - start
        cpu_used = {name: _cpu_s(proc) - cpu_before[name] for name, proc in cpu.items()}
        after = _overhead_buckets((await http.get(metrics_url)).text)
        info = await redis.info("memory")
        measured.memory[step + 1] = int(info["used_memory"])
        measured.clients_memory[step + 1] = int(info["mem_clients_normal"])
        measured.num_keys[step + 1] = len(
            [k async for k in redis.scan_iter(match=load.keys.pattern(), count=1000)]
        )
        measured.grown_per_execution.append(grown / concurrency)
        entry = measured.level_entry(key, concurrency, tool_s, cpu)
        _record_step(entry, harnesses, wall_s, cpu_used, (scrape, after))
        progress = {
            "step": step + 1,
            "concurrency": concurrency,
            "tool_s": tool_s,
            "wall_s": round(wall_s, 2),
            "used_memory": measured.memory[step + 1],
            "keys": measured.num_keys[step + 1],
            "errors": entry["errors"],
            "unfinished": load.num_cut,
            "overhead_ms_p50": _ms(entry["p50"][-1] or 0.0),
            "overhead_ms_p99": _ms(entry["p99"][-1] or 0.0),
            "lost": len(load.lost),
        }
        print(json.dumps(progress), file=sys.stderr)


def _stack_config(args: argparse.Namespace, workdir: Path, nats_url: str, redis_url: str) -> dict[str, Any]:
    return {
        "run": {"id": RUN_ID, "dir": str(workdir / "runs")},
        "nats": {"url": nats_url},
        "redis": {"url": redis_url},
        "log": {"level": "warning", "format": "json"},
        "model": {"path": str(bench_model(workdir / "model", tokenizer="bpe"))},
        "cell_agent": {
            "engine": {
                "output_source": "scripted",
                "max_batch_size": 512,
                "kv_cache_tokens": args.kv_cache_tokens,
            }
        },
    }


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    nats: ServerProcess = start_nats(workdir / "nats")
    off = args.aof == "off"
    redis_server: ServerProcess = start_redis(
        workdir / "redis", appendonly=not off, appendfsync=DEFAULT_APPENDFSYNC if off else args.aof
    )
    processes: list[subprocess.Popen[bytes]] = []
    levels = [int(c) for c in args.concurrency.split(",")]
    measured = Measurements()
    try:
        config = _stack_config(args, workdir, nats.url, redis_server.url)
        engine_url, endpoint = await start_engine_and_proxy(workdir, config, processes)
        engine_proc, proxy_proc = processes[-2:]
        load = Load(args, workdir, redis_server.url, nats.url)
        redis = await connect_redis(redis_server.url)
        bus = await EventBus.connect(nats.url, run_id=RUN_ID, source="load")
        await bus.consume(
            "load-scheduler",
            [ev.ExecutionStarted, ev.ExecutionTerminated],
            measured.count_event,
            batch=64,
            max_ack_pending=4096,
        )
        async with (
            aio_channel(f"127.0.0.1:{endpoint['grpc_port']}") as channel,
            httpx.AsyncClient(timeout=600) as http,
        ):
            stub = proxy_pb2_grpc.ProxyStub(channel)
            await stub.UpdateRoutes(
                proxy_pb2.UpdateRoutesRequest(
                    engines=[common_pb2.EngineEndpoint(engine_id="cell-0", url=engine_url, cell=0)],
                    default_engine_id="cell-0",
                )
            )
            flat = args.flat_concurrency or levels[0]
            # (concurrency, tool time, entry): the flatness steps run back to back (the proxy saturated),
            # then each level once at the paced call rate.
            plan = [(flat, 0.0, "saturated")] * args.steps + [(c, args.tool_s, str(c)) for c in levels]
            measured.affinity = _pin(
                args.pin, proxy_proc.pid, [engine_proc.pid], [nats.proc.pid, redis_server.proc.pid]
            )
            cpu = {
                "proxy": psutil.Process(proxy_proc.pid),
                "engine": psutil.Process(engine_proc.pid),
                "harnesses": psutil.Process(),
            }
            stack = {
                "http": http,
                "stub": stub,
                "redis": redis,
                "bus": bus,
                "engine_url": engine_url,
                "metrics_url": f"http://127.0.0.1:{endpoint['metrics_port']}/metrics",
                "base_url": endpoint["base_url"],
                "cpu": cpu,
            }
            await _run_steps(args, load, measured, plan, stack)
            for _ in range(200):
                if measured.events_consumed >= load.num_events:
                    break
                await asyncio.sleep(0.05)
        await bus.close()
        await redis.aclose()
    finally:
        stop_processes(processes)
        nats.stop()
        redis_server.stop()
    return _summary(args, levels, load, measured)


def _level(entry: dict[str, Any]) -> dict[str, Any]:
    """One concurrency level's figures: proxy overhead, client latency, calls, CPU per call."""
    p50s = [p for p in entry["p50"] if p is not None]
    p99s = [p for p in entry["p99"] if p is not None]
    calls = entry["calls"]
    latencies = [x for xs in entry["by_turn"].values() for x in xs]
    return {
        "concurrency": entry["concurrency"],
        "tool_s": entry["tool_s"],
        "proxy_overhead_ms_p50": _ms(statistics.median(p50s)) if p50s else None,
        "proxy_overhead_ms_p99": _ms(max(p99s)) if p99s else None,
        "client_ms_p50": _ms(statistics.median(latencies)) if latencies else None,
        "client_ms_p99": _ms(_percentile(latencies, 0.99)) if latencies else None,
        "client_ms_p99_by_turn": [_ms(_percentile(xs, 0.99)) for _, xs in sorted(entry["by_turn"].items())],
        "errors": entry["errors"],
        "error_samples": entry.get("error_samples", []),
        "calls": calls,
        "calls_per_s": round(calls / entry["wall_s"], 1) if entry["wall_s"] else None,
        "cpu_ms_per_call": {
            name: round(1000 * used / calls, 2) if calls else None for name, used in entry["cpu_s"].items()
        },
        "proxy_cpu_busy": round(entry["cpu_s"]["proxy"] / entry["wall_s"], 3) if entry["wall_s"] else None,
    }


def _summary(args: argparse.Namespace, levels: list[int], load: Load, m: Measurements) -> dict[str, Any]:
    results, memory, clients = m.results, m.memory, m.clients_memory
    span_s = m.last_event_s - m.first_event_s
    last = min(max(memory), args.steps)
    return {
        "by_concurrency": {k: _level(e) for k, e in results.items() if k != "saturated"},
        "saturated": _level(results["saturated"]) if "saturated" in results else None,
        "errors": sum(e["errors"] for e in results.values()),
        "lost": len(load.lost),
        "unfinished_at_step_timeout": load.num_cut,
        "lost_detail": load.lost[:10],
        "events": load.num_events,
        "events_consumed": m.events_consumed,
        "events_per_s": round(m.events_consumed / span_s, 1) if span_s > 0 else None,
        "redis_bytes_per_execution": round(statistics.median(m.grown_per_execution)),
        "redis_bytes_per_execution_by_step": [round(g) for g in m.grown_per_execution],
        "redis_used_memory_after_step": memory,
        "redis_keys_after_step": m.num_keys,
        "used_memory_ratio_last_vs_4": round(memory[last] / memory[4], 3) if 4 in memory else None,
        "redis_clients_memory_after_step": clients,
        "used_memory_less_clients_ratio_last_vs_4": round(
            (memory[last] - clients[last]) / (memory[4] - clients[4]), 3
        )
        if 4 in memory
        else None,
        "cpu_affinity": m.affinity,
        "turns": args.turns,
        "tool_s": args.tool_s,
        "initial_kb": args.initial_kb,
        "group_size": args.group_size,
        "flatness_steps": args.steps,
        "flatness_concurrency": args.flat_concurrency or levels[0],
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench load", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--concurrency", default="64,256,1152", help="comma-separated; the first runs --steps steps"
    )
    parser.add_argument("--turns", type=int, default=4, help="calls per execution")
    parser.add_argument("--steps", type=int, default=12, help="steps at the first concurrency (flatness)")
    parser.add_argument(
        "--flat-concurrency",
        type=int,
        default=0,
        help="executions per flatness step (0 = the first --concurrency level)",
    )
    parser.add_argument("--group-size", type=int, default=8, help="executions per group")
    parser.add_argument(
        "--tool-s",
        type=float,
        default=TOOL_S,
        help="mean tool time before each call at the paced levels (exponential; 0 = back to back)",
    )
    parser.add_argument("--initial-kb", type=int, default=4, help="size of the first request's JSON")
    parser.add_argument(
        "--lines-per-turn", type=int, default=30, help="tool-output lines added per turn (~60 B each)"
    )
    parser.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=4_000_000,
        help="engine KV pool: every execution's context at once, so the engine never queues",
    )
    parser.add_argument(
        "--step-timeout-s",
        type=float,
        default=0.0,
        help="cut a step's harnesses after this long (0 = never); reported as unfinished_at_step_timeout",
    )
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave every process on every CPU (default: the proxy on a CPU of its own)",
    )
    parser.add_argument(
        "--aof",
        choices=["off", "no", "everysec", "always"],
        default=DEFAULT_APPENDFSYNC,
        help="Redis's append-only file: off, or its appendfsync policy (default: a run's)",
    )
    parser.add_argument("--json", action="store_true", help="accepted: the last line is always JSON")
    args = parser.parse_args(argv)
    for c in [*args.concurrency.split(","), str(args.flat_concurrency)]:
        if not c.strip().isdigit() or int(c) % args.group_size:
            parser.error(
                f"--concurrency: each level must be a multiple of --group-size {args.group_size}; got {c!r}"
            )
    run_bench("load", lambda work: run(args, work))


if __name__ == "__main__":
    main(sys.argv[1:])
