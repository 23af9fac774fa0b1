"""`python -m app.stack.sandbox_check` on this host, as a deployment's container runs it: a deployment's TLS
directory (`gyre tls init`, keys, Redis passwords, the ACL file), real nats-server and redis-server, and an
HTTP listener where the proxy's harness API would be. Under the `isolated` launcher the check's sandbox
reads none of the secrets, reaches neither server, and gets an HTTP answer through its relay to the
"proxy": exit 0. Under `process` (the runner's own user) it reads the keys and reaches the servers: exit 1
— the check can fail. With nothing listening where the proxy should be, `proxy_reached` is false and the
check fails too (a sandbox whose network is broken proves nothing). The compose bench runs the same module
in the runner's and the evaluator's containers (tests/integration/test_compose_cluster.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.stack.servers import ServerProcess
from gyre import tls
from gyre.paths import REPO_ROOT
from tests.support.sandboxes import unavailable

IDENTITIES = {"runner": [], "evaluator": [], "proxy": [], "nats": [], "redis": [], "cli": []}


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    out = tmp_path / "tls"
    tls.issue(out, IDENTITIES)
    (out / "runner" / "redis.json").write_text(json.dumps({"user": "runner", "password": "canary"}))
    (out / "runner" / "redis.json").chmod(0o600)
    return out


@pytest.fixture
def proxy_port(tls_dir: Path) -> Iterator[int]:
    """HTTPS without client certificates, as the proxy's harness API serves it with tls.enabled."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    context = tls.TlsFiles.under(tls_dir, "proxy").server_context(require_client=False)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp_path: Path, nats: ServerProcess, redis: ServerProcess, proxy_http_port: int) -> Path:
    tls_dir = tmp_path / "tls"
    config = {
        "run": {"id": "sandbox-check", "dir": str(tmp_path / "runs")},
        "tls": {"enabled": True, "dir": str(tls_dir)},
        "nats": {"url": f"tls://127.0.0.1:{nats.port}"},
        "redis": {"url": f"rediss://127.0.0.1:{redis.port}"},
        "proxy": {"http_port": proxy_http_port},
        "runner": {"port": _free_port(), "sandbox": {"uid_base": 161000}},
        "evaluator": {"sandbox": {"uid_base": 162000}},
    }
    path = tmp_path / "gyre.yaml"
    path.write_text(yaml.safe_dump(config))
    (tmp_path / "runs").mkdir()
    return path


def _check(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "app.stack.sandbox_check", "--config", str(config), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-2000:]
    return done.returncode, json.loads(lines[-1])


def _root_or_skip() -> None:
    if os.geteuid() != 0:
        unavailable("the isolated launcher needs root (make test runs as root)")


def test_an_isolated_sandbox_reads_no_credential_and_reaches_only_the_proxy(
    tmp_path: Path, nats_server: ServerProcess, redis_server: ServerProcess, proxy_port: int
) -> None:
    _root_or_skip()
    config = _config(tmp_path, nats_server, redis_server, proxy_port)
    code, seen = _check(config, "--service", "runner")
    assert seen["launcher"] == "isolated" and seen["sandbox_uid"] == 161000 + 900 * 1000, seen
    keys = {str(tmp_path / "tls" / i / "tls.key") for i in IDENTITIES}
    assert seen["files_tried"] >= len(keys) + 1 and seen["connections_tried"] == 3, seen
    assert seen["credentials_read"] == [] and seen["connections_accepted"] == [], seen
    assert seen["proxy_reached"] is True and seen["ok"] is True and code == 0, seen
    code, seen = _check(config, "--service", "evaluator")
    assert (code, seen["ok"], seen["credentials_read"], seen["connections_accepted"]) == (0, True, [], []), (
        seen
    )
    assert seen["proxy_reached"] is None, "a verifier's sandbox has no network at all"


def test_the_process_launcher_is_caught_reading_the_keys(
    tmp_path: Path, nats_server: ServerProcess, redis_server: ServerProcess, proxy_port: int
) -> None:
    config = _config(tmp_path, nats_server, redis_server, proxy_port)
    code, seen = _check(config, "--service", "runner", "--isolation", "process")
    assert code == 1 and seen["ok"] is False, seen
    assert str(tmp_path / "tls" / "runner" / "tls.key") in seen["credentials_read"], seen
    assert str(tmp_path / "tls" / "runner" / "redis.json") in seen["credentials_read"], seen
    assert {f"127.0.0.1:{nats_server.port}", f"127.0.0.1:{redis_server.port}"} <= set(
        seen["connections_accepted"]
    ), seen


def test_a_sandbox_that_cannot_reach_the_proxy_fails_the_check(
    tmp_path: Path, tls_dir: Path, nats_server: ServerProcess, redis_server: ServerProcess
) -> None:
    _root_or_skip()
    config = _config(tmp_path, nats_server, redis_server, _free_port())
    code, seen = _check(config, "--service", "runner")
    assert seen["credentials_read"] == [] and seen["proxy_reached"] is False, seen
    assert code == 1 and seen["ok"] is False, seen
