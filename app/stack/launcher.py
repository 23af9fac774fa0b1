"""`gyre up` / `gyre down` / `gyre status`: the local stack as processes on 127.0.0.1.

`up` resolves the run (free ports for every server and service, gloo on loopback, fresh per-service
credentials for the NATS and Redis it starts), writes `runs/<run>/config.yaml`, and starts the run's
supervisor (app/stack/supervisor.py), which starts and watches every process; `up` returns once all
answer SERVING (from `runs/<run>/stack.json`). `attached=True` (a foreground `gyre up`, `gyre demo`)
ties the supervisor to the calling thread: when the caller dies, the kernel stops the run.

`down` SIGTERMs the supervisor, which stops everything within `run.supervisor.stop_bound_s`; when no
supervisor is left (it was SIGKILLed), `down` adopts the recorded processes and stops them itself.
`status` reports each process, its health, ports and restarts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import yaml

from app.stack.credentials import generate
from app.stack.health import grpc_health, tail
from app.stack.servers import LOOPBACK, free_port
from app.stack.state import ProcessEntry, StackState
from app.stack.supervisor import SERVICES
from gyre.config import GyreConfig, load_config
from gyre.engine.backends import check_engine
from gyre.log import get_logger
from gyre.model.model_dir import ModelDir
from gyre.procs import alive as _alive
from gyre.procs import die_with_parent, stop_processes
from gyre.sandbox import SandboxError
from gyre.sandbox.host import check_sandboxes, remove_run_sandboxes
from gyre.tasks import TaskError, TaskSet
from gyre.trainer.layout import check_trainer
from services.runner.harnesses import check_harness

__all__ = [
    "SERVICES",
    "ProcessEntry",
    "StackError",
    "StackState",
    "down",
    "down_state",
    "grpc_health",
    "live_runs",
    "pid_alive",
    "resolve_run",
    "status",
    "up",
]

log = get_logger("app.stack")


class StackError(RuntimeError):
    """The stack could not be brought up or down; the message says which process and why."""


def pid_alive(pid: int) -> bool:
    """`pid` runs and is not a zombie."""
    return _alive(pid)


def resolve_ports(config: GyreConfig) -> GyreConfig:
    """A copy of `config` where every 0 port is a free loopback port, and gloo binds loopback when the run
    does (the embedded default): nothing of it listens outside 127.0.0.1."""
    c = config.model_copy(deep=True)
    for section in (c.scheduler, c.proxy, c.runner, c.evaluator, c.packer):
        if section.port == 0:
            section.port = free_port()
    if c.proxy.http_port == 0:
        c.proxy.http_port = free_port()
    k = c.scheduler.num_cells
    c.cell_agent.ports = [p or free_port() for p in (c.cell_agent.ports + [0] * k)[:k]]
    c.cell_agent.engine_ports = [p or free_port() for p in (c.cell_agent.engine_ports + [0] * k)[:k]]
    if c.run.host == LOOPBACK and c.cell_agent.trainer.dist_socket_ifname is None:
        c.cell_agent.trainer.dist_socket_ifname = "lo"
    return c


def _plan_servers(config: GyreConfig, run_dir: Path) -> list[str]:
    """Fix the ports, URLs and credentials of the servers the stack starts (those without a URL)."""
    servers = []
    if not config.nats.url:
        servers.append("nats")
        config.nats.port = config.nats.port or free_port()
        config.nats.monitor_port = config.nats.monitor_port or free_port()
        config.nats.url = f"nats://{LOOPBACK}:{config.nats.port}"
    if not config.redis.url:
        servers.append("redis")
        config.redis.port = config.redis.port or free_port()
        config.redis.url = f"redis://{LOOPBACK}:{config.redis.port}/0"
    if servers:
        creds = generate(run_dir, config.run.id)
        if "nats" in servers:
            config.nats.credentials_file = creds.nats_template
        if "redis" in servers:
            config.redis.credentials_file = creds.redis_template
    return servers


def up(
    config: GyreConfig, wait_s: float = 15.0, attached: bool = True, stop: threading.Event | None = None
) -> StackState:
    """Start the run's supervisor and wait until every service is SERVING; on failure, or when `stop` is set
        meanwhile, stop everything started and raise `StackError`. A model directory the services could not
        load, or a trainer layout that cannot build it, raises `ModelError` before anything starts (a weight
    transport or harness that is not registered: `ConfigError`)."""
    model = ModelDir.open(config.model)
    check_trainer(config.cell_agent.trainer, model.path)
    check_engine(config.cell_agent.engine, model.path)  # ConfigError (exit 2): an engine that cannot start
    try:
        TaskSet.from_section(config.tasks)  # a malformed task fails here, before anything is spawned
    except TaskError as e:
        raise StackError(f"tasks: {e}") from None
    check_harness(config.runner)  # ConfigError (exit 2): runner.harness names no registered harness
    check_sandboxes(config)  # ConfigError (exit 2) when a launcher cannot run here: no container engine
    run_dir = config.run.path.resolve()
    previous = StackState.load(run_dir)
    if previous is not None and previous.live():
        raise StackError(f"run {config.run.id!r} is already up (see `gyre status`); run `gyre down` first")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    StackState.path(run_dir).unlink(missing_ok=True)
    config = config.model_copy(deep=True)
    config.run.dir = run_dir.parent
    config.model.path = model.path
    servers = _plan_servers(config, run_dir)
    config = resolve_ports(config)
    config_path = run_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return launch_supervisor(config, config_path, run_dir, servers, wait_s, attached=attached, stop=stop)


def launch_supervisor(
    config: GyreConfig,
    config_path: Path,
    run_dir: Path,
    servers: list[str],
    wait_s: float,
    *,
    attached: bool,
    stop: threading.Event | None,
) -> StackState:
    """Start the run's supervisor on `config_path` and wait until it serves (stopped again on failure);
    `gyre up` and `gyre resume` both start a run this way."""
    argv = [
        sys.executable,
        "-m",
        "app.stack.supervisor",
        "--config",
        str(config_path),
        "--servers",
        ",".join(servers),
        "--wait-s",
        str(wait_s),
    ]
    with open(run_dir / "logs" / "supervisor.log", "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=die_with_parent() if attached else None,
        )
    try:
        return _wait_serving(proc, run_dir, wait_s + 30.0, stop or threading.Event())
    except BaseException:
        _stop_supervisor(proc.pid, config.run.supervisor.stop_bound_s)
        raise


def _wait_serving(
    proc: subprocess.Popen[bytes], run_dir: Path, timeout_s: float, stop: threading.Event
) -> StackState:
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        state = StackState.load(run_dir)
        if state is not None and state.phase == "serving":
            return state
        if proc.poll() is not None:
            error = (
                state.error
                if state is not None and state.error
                else tail(str(run_dir / "logs" / "supervisor.log"))
            )
            StackState.path(run_dir).unlink(missing_ok=True)
            raise StackError(error)
        if time.monotonic() > deadline:
            raise StackError(f"the stack did not come up within {timeout_s:.0f} s (logs in {run_dir}/logs)")
        time.sleep(0.1)
    raise StackError("stopped during start-up")


def _stop_supervisor(pid: int, bound_s: float) -> bool:
    """SIGTERM the supervisor and wait for it (it stops the run); SIGKILL it past the bound. True if it was alive."""
    try:
        p = psutil.Process(pid)
        p.send_signal(signal.SIGTERM)
    except psutil.Error:
        return False
    try:
        p.wait(timeout=bound_s + 5.0)
    except psutil.TimeoutExpired:
        with contextlib.suppress(psutil.NoSuchProcess):  # it may end just past the bound
            p.kill()
            p.wait(timeout=5.0)
    return True


def down_state(state: StackState) -> None:
    """Stop every process of `state`: through its supervisor, else directly (adopting them)."""
    if state.supervisor_alive():
        _stop_supervisor(state.supervisor_pid, state.stop_bound_s)
    services = [p.process_id for p in state.processes if p.alive() and p.name not in ("nats", "redis")]
    servers = [p.process_id for p in state.processes if p.alive() and p.name in ("nats", "redis")]
    stop_processes(services, grace_s=10.0)
    stop_processes(servers, grace_s=3.0)
    remove_sandboxes(Path(state.config_path))
    StackState.path(Path(state.run_dir)).unlink(missing_ok=True)


def remove_sandboxes(config_path: Path) -> int:
    """Remove every sandbox the run kept (its containers): the last step of every stop of a run."""
    try:
        config = load_config(config_path)
        return remove_run_sandboxes(config)
    except (OSError, ValueError, SandboxError) as e:
        log.error("sandboxes_not_removed", error=str(e))
        return 0


def down(run_dir: Path) -> bool:
    """Stop the stack recorded under `run_dir`; False when nothing was recorded."""
    state = StackState.load(run_dir.resolve())
    if state is None:
        return False
    down_state(state)
    return True


def live_runs(runs_dir: Path) -> list[Path]:
    """Run folders under `runs_dir` whose recorded stack still has a live process (newest first)."""
    found = []
    for stack_file in runs_dir.glob("*/stack.json"):
        state = StackState.load(stack_file.parent)
        if state is not None and state.live():
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


def metrics_port(run_dir: Path, name: str, pid: int) -> int:
    """The `/metrics` port a live service wrote to its endpoint file (`runs/<run>/services/<name>.json`);
    0 when it has none (not serving yet, `metrics.serve: false`, or the file is of an earlier process)."""
    try:
        info = json.loads((run_dir / "services" / f"{name}.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(info.get("metrics_port", 0)) if isinstance(info, dict) and info.get("pid") == pid else 0


def status(run_dir: Path) -> list[dict[str, object]]:
    """One row per process (the supervisor first): name, pid, alive, health, ports (`metrics_port` for a
    service's `/metrics`), restarts, last exit."""
    state = StackState.load(run_dir.resolve())
    if state is None:
        return []
    rows: list[dict[str, object]] = []
    if state.supervisor_pid:
        up_ = state.supervisor_alive()
        rows.append(
            {
                "name": "supervisor",
                "pid": state.supervisor_pid,
                "alive": up_,
                "health": state.phase.upper() if up_ else "DEAD",
                "grpc_port": 0,
                "restarts": 0,
                "last_exit": "",
                **({"error": state.error} if state.error else {}),
            }
        )
    for p in state.processes:
        alive = p.alive()
        if p.state == "restarting":
            health = "RESTARTING"
        elif p.state == "gave_up":
            health = "GAVE_UP"
        elif p.state == "lost":
            health = "LOST"
        elif p.state == "left":
            health = "LEFT"
        else:
            health = grpc_health(p.grpc_port) if (alive and p.grpc_port) else ("RUNNING" if alive else "DEAD")
        metrics = metrics_port(Path(state.run_dir), p.name, p.pid) if alive and p.grpc_port else 0
        rows.append(
            {
                "name": p.name,
                "pid": p.pid,
                "alive": alive,
                "health": health,
                "grpc_port": p.grpc_port,
                "restarts": p.num_restarts,
                "last_exit": p.last_exit,
                **({"ports": p.ports} if p.ports else {}),
                **({"metrics_port": metrics} if metrics else {}),
            }
        )
    return rows
