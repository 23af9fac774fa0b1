"""`gyre up` / `gyre down` / `gyre status`: the local stack as processes on 127.0.0.1.

`up` starts nats-server and redis-server (unless the config names existing ones), assigns free
ports to every service, writes the resolved config to `runs/<run>/config.yaml`, spawns one process
per service (K cell agents) with logs under `runs/<run>/logs/`, waits until each answers SERVING on
grpc.health.v1, and records pids and ports in `runs/<run>/stack.json`. `down` stops them all
(SIGTERM, grace, SIGKILL) in reverse order; `status` reports each process, its health and ports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gyre.config import GyreConfig
from gyre.stack.servers import LOOPBACK, free_port, start_nats, start_redis
from gyre.tasks import TaskError, TaskSet

SERVICES: tuple[str, ...] = ("scheduler", "proxy", "runner", "evaluator", "packer", "cell_agent")


class StackError(RuntimeError):
    """The stack could not be brought up or down; the message says which process and why."""


@dataclass
class ProcessEntry:
    name: str
    pid: int
    grpc_port: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    log: str = ""


@dataclass
class StackState:
    run_id: str
    run_dir: str
    config_path: str
    processes: list[ProcessEntry] = field(default_factory=list)

    @staticmethod
    def path(run_dir: Path) -> Path:
        return run_dir / "stack.json"

    def save(self) -> None:
        StackState.path(Path(self.run_dir)).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> StackState | None:
        p = cls.path(run_dir)
        if not p.exists():
            return None
        raw = json.loads(p.read_text())
        raw["processes"] = [ProcessEntry(**e) for e in raw["processes"]]
        return cls(**raw)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def grpc_health(port: int, timeout_s: float = 1.0) -> str:
    """SERVING / NOT_SERVING / UNKNOWN / UNREACHABLE for a gRPC server on loopback."""
    with grpc.insecure_channel(f"{LOOPBACK}:{port}") as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return "UNREACHABLE"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def resolve_ports(config: GyreConfig) -> GyreConfig:
    """A copy of `config` where every 0 port is a free loopback port."""
    c = config.model_copy(deep=True)
    for section in (c.scheduler, c.proxy, c.runner, c.evaluator, c.packer):
        if section.port == 0:
            section.port = free_port()
    if c.proxy.http_port == 0:
        c.proxy.http_port = free_port()
    k = c.scheduler.num_cells
    c.cell_agent.ports = [p or free_port() for p in (c.cell_agent.ports + [0] * k)[:k]]
    c.cell_agent.engine_ports = [p or free_port() for p in (c.cell_agent.engine_ports + [0] * k)[:k]]
    return c


def up(config: GyreConfig, wait_s: float = 15.0) -> StackState:
    """Start brokers and services; on any failure stop what was started and raise `StackError`."""
    try:
        TaskSet.from_section(config.tasks)  # a malformed task fails here, before anything is spawned
    except TaskError as e:
        raise StackError(f"tasks: {e}") from None
    run_dir = config.run.path.resolve()
    previous = StackState.load(run_dir)
    if previous and any(pid_alive(p.pid) for p in previous.processes):
        raise StackError(f"run {config.run.id!r} is already up (see `gyre status`); run `gyre down` first")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    config = config.model_copy(deep=True)
    config.run.dir = run_dir.parent
    state = StackState(config.run.id, str(run_dir), str(run_dir / "config.yaml"))
    try:
        if not config.nats.url:
            nats = start_nats(run_dir / "nats", config.nats.port, config.nats.monitor_port, run_dir / "logs" / "nats.log")
            config.nats.url = nats.url
            state.processes.append(ProcessEntry("nats", nats.proc.pid, 0, {"client": nats.port, **nats.extra_ports}))
        if not config.redis.url:
            redis = start_redis(run_dir / "redis", config.redis.port, config.redis.appendonly,
                                run_dir / "logs" / "redis.log")
            config.redis.url = redis.url
            state.processes.append(ProcessEntry("redis", redis.proc.pid, 0, {"client": redis.port}))
        config = resolve_ports(config)
        Path(state.config_path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        state.save()
        for name, instance, port in _service_plan(config):
            state.processes.append(_spawn(name, instance, port, state, run_dir))
        state.save()
        _wait_serving(state, wait_s)
    except BaseException:
        down_state(state)
        raise
    return state


def _service_plan(config: GyreConfig) -> list[tuple[str, int | None, int]]:
    plan: list[tuple[str, int | None, int]] = []
    for name in SERVICES:
        if name == "cell_agent":
            plan += [(name, k, port) for k, port in enumerate(config.cell_agent.ports)]
        else:
            plan.append((name, None, int(getattr(config, name).port)))
    return plan


def _spawn(name: str, instance: int | None, port: int, state: StackState, run_dir: Path) -> ProcessEntry:
    label = name if instance is None else f"{name}-{instance}"
    log_path = run_dir / "logs" / f"{label}.log"
    cmd = [sys.executable, "-m", f"services.{name}", "--config", state.config_path]
    if instance is not None:
        cmd += ["--instance", str(instance)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return ProcessEntry(label, proc.pid, port, {}, str(log_path))


def _wait_serving(state: StackState, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    waiting = [p for p in state.processes if p.grpc_port]
    while waiting:
        for p in list(waiting):
            if not pid_alive(p.pid):
                raise StackError(f"{p.name} exited during start-up; last log lines:\n{_tail(p.log)}")
            if grpc_health(p.grpc_port, timeout_s=0.5) == "SERVING":
                waiting.remove(p)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(p.name for p in waiting)
            raise StackError(f"not SERVING after {wait_s:.0f} s: {names}; last log lines of {waiting[0].name}:\n"
                             f"{_tail(waiting[0].log)}")
        if waiting:
            time.sleep(0.1)


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop_pid(pid: int, grace_s: float) -> None:
    if not pid_alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    if pid_alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        while pid_alive(pid):
            _reap(pid)
            time.sleep(0.05)
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def down_state(state: StackState, grace_s: float = 10.0) -> None:
    """Stop services first (newest first), then Redis and NATS."""
    services = [p for p in state.processes if p.name not in ("nats", "redis")]
    servers = [p for p in state.processes if p.name in ("nats", "redis")]
    for p in reversed(services):
        _stop_pid(p.pid, grace_s)
    for p in reversed(servers):
        _stop_pid(p.pid, grace_s)
    StackState.path(Path(state.run_dir)).unlink(missing_ok=True)


def down(run_dir: Path, grace_s: float = 10.0) -> bool:
    """Stop the stack recorded under `run_dir`; False when nothing was recorded."""
    state = StackState.load(run_dir.resolve())
    if state is None:
        return False
    down_state(state, grace_s)
    return True


def live_runs(runs_dir: Path) -> list[Path]:
    """Run folders under `runs_dir` whose recorded stack still has a live process (newest first)."""
    found = []
    for stack_file in runs_dir.glob("*/stack.json"):
        state = StackState.load(stack_file.parent)
        if state is not None and any(pid_alive(p.pid) for p in state.processes):
            found.append(stack_file.parent)
    return sorted(found, key=lambda d: StackState.path(d).stat().st_mtime, reverse=True)


def resolve_run(runs_dir: Path, configured: str, explicit: str | None) -> Path | None:
    """The run a stack command acts on: `explicit` when given; else the configured run when it is live;
    else the only live run under `runs_dir` (so `gyre status` finds a `gyre demo` run, whose id is
    stamped). None when that is ambiguous or nothing runs."""
    if explicit is not None:
        return runs_dir / explicit
    if StackState.load(runs_dir / configured) is not None:
        return runs_dir / configured
    live = live_runs(runs_dir)
    return live[0] if len(live) == 1 else None


def status(run_dir: Path) -> list[dict[str, object]]:
    """One row per process: name, pid, alive, health, ports."""
    state = StackState.load(run_dir.resolve())
    if state is None:
        return []
    rows: list[dict[str, object]] = []
    for p in state.processes:
        alive = pid_alive(p.pid)
        health = grpc_health(p.grpc_port) if (alive and p.grpc_port) else ("RUNNING" if alive else "DEAD")
        rows.append({"name": p.name, "pid": p.pid, "alive": alive, "health": health,
                     "grpc_port": p.grpc_port, **({"ports": p.ports} if p.ports else {})})
    return rows
