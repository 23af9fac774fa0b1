"""The local stack's supervisor, as a user meets it: `gyre up`, SIGKILL a service, nats-server and
redis-server, and find each restarted (same ports, data kept), counted in `gyre status` and published as
`ProcessExited`; a process out of restarts stops the run; Ctrl-C on a foreground `gyre up` stops every
process within the stated bound (20 s)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from app.demo.events import read_events
from app.stack.health import grpc_health
from app.stack.launcher import status
from app.stack.state import ProcessEntry, StackState
from gyre.bus import login_url
from gyre.config import load_config
from gyre.procs import alive
from tests.support.eventually import eventually_sync
from tests.support.models import small_dir

pytestmark = pytest.mark.slow

GYRE = [sys.executable, "-c", "from app.cli import main; main()"]
STOP_BOUND_S = 20.0
SMALL_RUN = """
scheduler: {num_cells: 1, group_size: 1, batch_groups: 1, phi: 0, mu: 1, rho_min: 1.0, cell_capacity: 1,
            max_steps: 1}
tasks: {queries: ["add/3+3"]}
"""


def _config(tmp_path: Path, run_id: str, supervisor: str = "{backoff_initial_s: 0.2}") -> Path:
    f = tmp_path / "gyre.yaml"
    f.write_text(
        f"run:\n  id: {run_id}\n  dir: {tmp_path / 'runs'}\n  supervisor: {supervisor}\nmodel:\n  path: {small_dir()}\n"
        f"{SMALL_RUN}"
    )
    return f


def _gyre(*args: str, config: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GYRE, *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def _rows(config: Path) -> dict[str, dict[str, Any]]:
    """`gyre status --json` by process name ({} while no stack is recorded yet)."""
    out = _gyre("status", "--json", config=config)
    return {r["name"]: r for r in json.loads(out.stdout)} if out.returncode == 0 else {}


def _status(config: Path) -> dict[str, dict[str, Any]]:
    """The rows `gyre status --json` prints, by process name, computed in this process (`_rows` runs the
    command: each run of it pays the CLI's start-up, seconds on a busy machine)."""
    return {str(r["name"]): r for r in status(load_config(config).run.path)}


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    eventually_sync(check, timeout_s=timeout_s, interval_s=0.3, what=what)


def _recorded(config: Path) -> dict[str, ProcessEntry]:
    """stack.json's processes by name, read directly (cheaper than `gyre status` in a wait loop)."""
    state = StackState.load(load_config(config).run.path)
    return {p.name: p for p in state.processes} if state is not None else {}


def _restarted(config: Path, name: str, old_pid: int) -> Callable[[], bool]:
    def check() -> bool:
        entry = _recorded(config).get(name)
        if entry is None or entry.pid == old_pid or not entry.alive():
            return False
        return not entry.grpc_port or grpc_health(entry.grpc_port) == "SERVING"

    return check


def _all_gone(pids: set[int], timeout_s: float) -> list[int]:
    """The pids of `pids` still alive after `timeout_s` (none, once they have all exited)."""

    def left() -> list[int]:  # not pid_exists + Process: the pid may exit in between
        return [p for p in pids if alive(p)]

    with contextlib.suppress(AssertionError):
        eventually_sync(lambda: not left(), timeout_s=timeout_s, interval_s=0.2, what="the processes to exit")
    return left()


def test_killed_service_nats_and_redis_are_restarted_with_their_data(tmp_path: Path) -> None:
    config = _config(tmp_path, "suptest")
    assert _gyre("up", "--detach", "--wait", "60", config=config).returncode == 0
    resolved = load_config(tmp_path / "runs" / "suptest" / "config.yaml")
    try:
        rows = _status(config)
        os.kill(rows["packer"]["pid"], signal.SIGKILL)
        _wait("packer restarted", _restarted(config, "packer", rows["packer"]["pid"]))
        packer = _rows(config)["packer"]
        assert packer["restarts"] == 1 and packer["last_exit"] == "killed by SIGKILL"

        login = resolved.redis.login_for("scheduler")
        assert login is not None
        store = redis.Redis.from_url(resolved.redis.url or "", username=login.user, password=login.password)
        store.set("gyre:suptest:test:{aof}:marker", b"kept")
        os.kill(rows["redis"]["pid"], signal.SIGKILL)
        _wait("redis restarted", _restarted(config, "redis", rows["redis"]["pid"]))
        _wait("redis answering", lambda: _ping(store))
        assert store.get("gyre:suptest:test:{aof}:marker") == b"kept"  # the AOF survived the SIGKILL
        store.close()

        os.kill(rows["nats"]["pid"], signal.SIGKILL)
        _wait("nats restarted", _restarted(config, "nats", rows["nats"]["pid"]))
        assert _status(config)["nats"]["ports"]["client"] == rows["nats"]["ports"]["client"]
        url = login_url(resolved.nats.url or "", resolved.nats.login_for("cli"))

        def exits() -> dict[str, Any]:
            """The first ProcessExited of each process (services may exit again while Redis is back)."""
            events = asyncio.run(read_events(url, "suptest"))
            first: dict[str, Any] = {}
            for e in events:
                if e.event.DESCRIPTOR.name == "ProcessExited":
                    first.setdefault(e.event.process, e)
            return first

        _wait("ProcessExited of packer, redis and nats", lambda: {"packer", "redis", "nats"} <= set(exits()))
        event = exits()["packer"]
        assert event.subject == "gyre.suptest.stack.process_exited"
        assert event.event.signal == "SIGKILL" and event.event.num_restarts == 1 and not event.event.gave_up
    finally:
        pids = {r["pid"] for r in _status(config).values()}
        assert _gyre("down", config=config).returncode == 0
    assert _all_gone(pids, 1.0) == []


def _phase(config: Path) -> str:
    state = StackState.load(load_config(config).run.path)
    return state.phase if state is not None else ""


def _ping(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_a_process_out_of_restarts_stops_a_foreground_run(tmp_path: Path) -> None:
    config = _config(tmp_path, "budget", supervisor="{max_restarts: 0}")
    up = subprocess.Popen(
        [*GYRE, "up", "--config", str(config), "--wait", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        _wait("the stack up", lambda: _phase(config) == "serving", 90)
        rows = _status(config)
        pids = {r["pid"] for r in rows.values()}
        os.kill(rows["packer"]["pid"], signal.SIGKILL)
        _, err = up.communicate(timeout=STOP_BOUND_S + 10)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 1
    assert "packer killed by SIGKILL; restart budget spent" in err
    assert _all_gone(pids, STOP_BOUND_S) == []


def test_ctrl_c_on_a_foreground_up_stops_every_process_within_the_bound(tmp_path: Path) -> None:
    config = _config(tmp_path, "ctrlc")
    up = subprocess.Popen(
        [*GYRE, "up", "--config", str(config), "--wait", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        _wait("the stack up", lambda: _phase(config) == "serving", 90)
        pids = {p.pid for p in psutil.Process(up.pid).children(recursive=True)}
        assert len(pids) >= 8  # supervisor, nats, redis, five services, one cell agent
        t0 = time.monotonic()
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=STOP_BOUND_S + 10)
        left = _all_gone(pids, max(0.0, STOP_BOUND_S - (time.monotonic() - t0)))
    finally:
        if up.poll() is None:
            up.kill()
    assert left == [] and up.returncode == 128 + signal.SIGINT
    assert not (tmp_path / "runs" / "ctrlc" / "stack.json").exists()


def test_a_service_that_cannot_start_fails_the_start_and_leaves_nothing_running(tmp_path: Path) -> None:
    config = _config(tmp_path, "nostart")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        config.write_text(config.read_text() + f"packer: {{port: {taken.getsockname()[1]}}}\n")
        up = _gyre("up", "--detach", "--wait", "60", config=config)
    assert up.returncode == 1 and "packer exited during start-up" in up.stderr, up.stderr
    log = (tmp_path / "runs" / "nostart" / "logs" / "supervisor.log").read_text()
    assert "stack_stopped" in log and not (tmp_path / "runs" / "nostart" / "stack.json").exists()
    assert _gyre("status", config=config).returncode == 1


def test_a_killed_supervisor_takes_its_processes_down_and_down_adopts_the_record(tmp_path: Path) -> None:
    config = _config(tmp_path, "orphans")
    assert _gyre("up", "--detach", "--wait", "60", config=config).returncode == 0
    state = StackState.load(tmp_path / "runs" / "orphans")
    assert state is not None
    pids = {p.pid for p in state.processes}
    os.kill(state.supervisor_pid, signal.SIGKILL)
    assert _all_gone(pids, STOP_BOUND_S) == []  # each child got SIGTERM from the kernel (PR_SET_PDEATHSIG)
    down = _gyre("down", config=config)
    assert down.returncode == 0 and "stopped run 'orphans'" in down.stdout
    assert not (tmp_path / "runs" / "orphans" / "stack.json").exists()
