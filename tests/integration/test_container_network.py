"""The network of a container sandbox, both ways: with `allow_internet = false` (the default) a command
in the container reaches the proxy (relayed to its own 127.0.0.1:<proxy port>) and nothing else — not
another port of the host's loopback, not the host on the engine's bridge, not an outside address; with
`allow_internet = true` the same command also reaches an address beyond the proxy (a server on the
bridge's host side), and still the proxy. With TLS on (`gyre tls init`), a harness in a container
reaches the proxy's HTTPS through the relay, trusting the deployment's CA the runner mounts for it."""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gyre import tls
from gyre.http_host import HttpHost
from gyre.sandbox import NetworkPolicy, SandboxSpec
from gyre.sandbox.launchers.base import LABEL_EXECUTION
from gyre.tasks import Task
from services.runner.harnesses import DemoHarness, Launch
from tests.support.containers import PYTHON_IMAGE, engine_client
from tests.support.eventually import eventually_sync
from tests.support.sandboxes import launcher_for_test

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("container_session")]

#: Tries to reach HOST:PORT for up to 10 s; prints `HOST:PORT ok <reply>` or the last error.
PROBE = """
probe() {
  for _ in $(seq 50); do
    if out=$( (exec 3<>/dev/tcp/$1/$2 && echo ping >&3 && head -c 64 <&3) 2>&1); then echo "$1:$2 ok $out"; return; fi
    case $out in *unreachable*) break;; esac
    sleep 0.2
  done
  echo "$1:$2 failed: ${out##*: }"
}
"""


class EchoServer:
    """A TCP server answering `<name>:` + what it received, on `host` (or on a socket bound already)."""

    def __init__(self, host: str, name: str, sock: socket.socket | None = None) -> None:
        self.name = name
        self.sock = sock or socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(f"{self.name}:".encode() + conn.recv(64))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def servers() -> Iterator[list[EchoServer]]:
    started: list[EchoServer] = []
    yield started
    for server in started:
        server.close()


def _bridge_gateway() -> str:
    """The host's address on the engine's default bridge network (podman's `podman`, docker's `bridge`)."""
    client = engine_client()
    for name in ("podman", "bridge"):
        try:
            config = client.networks.get(name).attrs["IPAM"]["Config"]
        except Exception:  # not this engine's default network
            continue
        for entry in config:
            if entry.get("Gateway"):
                return str(entry["Gateway"])
    pytest.fail("the engine's default bridge network has no gateway address")


async def _run(tmp_path: Path, proxy: EchoServer, egress: bool, targets: list[tuple[str, int]]) -> list[str]:
    launcher = launcher_for_test("container", 0, 1)
    script = PROBE + "".join(f"probe {host} {port}\n" for host, port in targets)
    spec = SandboxSpec(
        name=f"net-{uuid.uuid4().hex[:8]}",
        argv=["bash", "-c", script],
        cwd=Path("/"),
        env={},
        root=tmp_path / f"box-{egress}",
        network=NetworkPolicy.proxy("127.0.0.1", proxy.port, egress=egress),
        labels={LABEL_EXECUTION: f"net-{egress}"},
    )
    handle = await launcher.launch(spec)
    try:
        outcome = await handle.wait()
        assert outcome.exit_code == 0, outcome
        return handle.stdout().splitlines()
    finally:
        await handle.release()
        await handle.remove()
        await launcher.close()


async def test_without_internet_only_the_proxy_is_reached(tmp_path: Path, servers: list[EchoServer]) -> None:
    gateway = _bridge_gateway()
    proxy, other = EchoServer("127.0.0.1", "proxy"), EchoServer("127.0.0.1", "other")
    servers += [proxy, other]
    lines = await _run(
        tmp_path,
        proxy,
        egress=False,
        targets=[("127.0.0.1", proxy.port), ("127.0.0.1", other.port), (gateway, 9), ("1.1.1.1", 80)],
    )
    assert lines == [
        f"127.0.0.1:{proxy.port} ok proxy:ping",
        f"127.0.0.1:{other.port} failed: Connection refused",  # the container's own loopback
        f"{gateway}:9 failed: Network is unreachable",
        "1.1.1.1:80 failed: Network is unreachable",
    ]


async def test_with_internet_an_address_beyond_the_proxy_is_reached(
    tmp_path: Path, servers: list[EchoServer]
) -> None:
    gateway = _bridge_gateway()
    proxy = EchoServer("127.0.0.1", "proxy")
    servers.append(proxy)
    # The bridge's host address exists once a container is attached to it: the server binds it from a
    # thread as soon as it can, and the probe retries meanwhile.
    beyond_port = _free_port()
    binder = threading.Thread(target=_bind_when_up, args=(gateway, beyond_port, servers), daemon=True)
    binder.start()
    lines = await _run(
        tmp_path, proxy, egress=True, targets=[("127.0.0.1", proxy.port), (gateway, beyond_port)]
    )
    assert lines == [f"127.0.0.1:{proxy.port} ok proxy:ping", f"{gateway}:{beyond_port} ok beyond:ping"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bind_when_up(host: str, port: int, servers: list[EchoServer], timeout_s: float = 20.0) -> None:
    def bound() -> socket.socket | None:
        try:
            return socket.create_server((host, port))
        except OSError:
            return None

    with contextlib.suppress(AssertionError):
        servers.append(
            EchoServer(host, "beyond", eventually_sync(bound, timeout_s=timeout_s, interval_s=0.05))
        )


#: What a Python harness does first: one request to ANTHROPIC_BASE_URL with the default SSL context (which
#: reads SSL_CERT_FILE); prints the reply, or the error.
HTTPS_CALL = (
    "import os, urllib.request\n"
    "try:\n"
    "    print(urllib.request.urlopen(os.environ['ANTHROPIC_BASE_URL'] + '/hello', timeout=10).read().decode())\n"
    "except Exception as e:\n"
    "    print(type(e).__name__, e)\n"
)


async def _hello(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello over tls")


async def test_a_harness_in_a_container_reaches_the_https_proxy_trusting_the_mounted_ca(
    tmp_path: Path,
) -> None:
    engine_client(PYTHON_IMAGE)
    tls.issue(tmp_path / "tls", {"proxy": ["proxy"]})
    tls.configure(tls.TlsFiles.under(tmp_path / "tls", "proxy"))
    host = HttpHost(
        Starlette(routes=[Route("/hello", _hello)]),
        host="127.0.0.1",
        port=0,
        name="proxy-http",
        client_certificates=False,  # the harness API: API keys, no client certificate
    )
    launcher = launcher_for_test("container", 0, 2)
    try:
        await host.start()
        harness = DemoHarness()
        replies = []
        for trusted in (True, False):
            url = f"https://127.0.0.1:{host.port}"
            task = Task("hello", "Say hello.")
            launch = Launch(task, "Say hello.", "tls", url, "key", Path("/root"), inside=True)
            env = harness.environment(launch)
            assert env["SSL_CERT_FILE"] == env["NODE_EXTRA_CA_CERTS"] == env["CODEX_CA_CERTIFICATE"]
            spec = SandboxSpec(
                name=f"tls-{uuid.uuid4().hex[:8]}",
                argv=["python3", "-c", HTTPS_CALL],
                cwd=Path("/"),
                env=env if trusted else {k: v for k, v in env.items() if k != "SSL_CERT_FILE"},
                root=tmp_path / f"box-{trusted}",
                network=NetworkPolicy.proxy("127.0.0.1", host.port, egress=False),
                image=PYTHON_IMAGE,
                tools=harness.container_mounts(),
                labels={LABEL_EXECUTION: f"tls-{trusted}"},
            )
            handle = await launcher.launch(spec)
            try:
                outcome = await handle.wait()
                assert outcome.exit_code == 0, (outcome, handle.stdout())
                replies.append(handle.stdout().strip())
            finally:
                await handle.release()
                await handle.remove()
    finally:
        tls.configure(None)
        await host.stop()
        await launcher.close()
    trusted_reply, untrusted_reply = replies
    assert trusted_reply == "hello over tls"
    # Without the CA the same call is refused: the proxy's certificate is the deployment's, not a public one.
    assert untrusted_reply.startswith("URLError") and "CERTIFICATE_VERIFY_FAILED" in untrusted_reply
