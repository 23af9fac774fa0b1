"""Authorization by identity (gyre.authz): with TLS on, a gRPC method answers only the identities the table
allows it, whatever certificate of the deployment's CA the caller holds.

The table names every method of every service in gyre/v1 (a new RPC cannot be forgotten: without an entry
it is refused to everyone) and only identities `gyre tls init` and the cert-manager Certificates issue, by
the subject common name the check reads. Over a real grpc.aio server built by `gyre.rpc.new_server` with
certificates from `gyre.tls.issue`, and servicers registered through the generated
`add_*Servicer_to_server` (so the method names are the real ones): the allowed identity gets through, any
other gets PERMISSION_DENIED naming its identity and the method before the handler runs (unary, an async
generator stream, a `context.write` stream), a method not in the table is refused, and domain errors still
map to their status behind the check.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

import gyre.v1
from app.cli.tls import identities
from gyre import authz, tls
from gyre.config import load_config
from gyre.paths import REPO_ROOT
from gyre.rpc import add_health, aio_channel, bind, new_server
from gyre.v1 import cell_agent_pb2 as cell_pb
from gyre.v1 import cell_agent_pb2_grpc as cell_grpc
from gyre.v1 import common_pb2
from gyre.v1 import scheduler_pb2 as scheduler_pb
from gyre.v1 import scheduler_pb2_grpc as scheduler_grpc

SWITCH_ROLE, SHUTDOWN = "/gyre.v1.CellAgent/SwitchRole", "/gyre.v1.Scheduler/Shutdown"
FETCH, WATCH = "/gyre.v1.CellAgent/FetchPublished", "/grpc.health.v1.Health/Watch"
UNLISTED = "/gyre.test.Unlisted/Echo"


def _service_methods() -> set[str]:
    """Every method of every service the protos of gyre/v1 define, as `/package.Service/Method`."""
    methods = set()
    for module in pkgutil.iter_modules(gyre.v1.__path__):
        if not module.name.endswith("_pb2"):
            continue
        descriptor = importlib.import_module(f"gyre.v1.{module.name}").DESCRIPTOR
        for service in descriptor.services_by_name.values():
            methods |= {f"/{service.full_name}/{m.name}" for m in service.methods}
    return methods


def test_every_method_of_every_service_has_an_entry() -> None:
    methods = _service_methods()
    assert SWITCH_ROLE in methods and FETCH in methods  # the protos were found
    health_methods = {
        f"/grpc.health.v1.Health/{m.name}" for m in health_pb2.DESCRIPTOR.services_by_name["Health"].methods
    }
    assert sorted(methods - set(authz.METHODS)) == [], "a method without an entry is refused to everyone"
    assert sorted(set(authz.METHODS) - methods - health_methods) == [], "an entry of no method"
    assert all(authz.METHODS.values()), "an entry that allows no one"


def test_every_identity_named_is_issued_under_that_common_name() -> None:
    for method, allowed in authz.METHODS.items():
        assert allowed <= authz.IDENTITIES, method
    issued = identities(load_config(None, environ={}), [])  # gyre tls init: one per service, one per cell
    assert {tls.common_name(identity) for identity in issued} == authz.IDENTITIES
    assert {"cell_agent-0", "cell_agent-1", "cell_agent-2"} <= set(issued) and "cell_agent" not in issued
    manifests = REPO_ROOT / "deploy" / "k8s" / "components" / "cert-manager" / "certificates.yaml"
    names = {
        doc["spec"]["commonName"]
        for doc in yaml.safe_load_all(manifests.read_text())
        if doc and doc["kind"] == "Certificate" and not doc["spec"].get("isCA")
    }
    assert names == authz.IDENTITIES


# ---- over a real server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tls")
    tls.issue(out, {identity: [] for identity in [*authz.IDENTITIES, "cell_agent-1"]})  # and cell 1's own
    return out


@pytest.fixture
def as_identity() -> Iterator[None]:
    yield
    tls.configure(None)


class _Cell(cell_grpc.CellAgentServicer):
    def __init__(self) -> None:
        self.called: list[str] = []

    async def SwitchRole(
        self, request: cell_pb.SwitchRoleRequest, context: Any
    ) -> cell_pb.SwitchRoleResponse:
        self.called.append("SwitchRole")
        if request.role == common_pb2.CELL_ROLE_UNSPECIFIED:
            raise ValueError("no role")
        return cell_pb.SwitchRoleResponse(role=request.role)

    async def FetchPublished(
        self, request: cell_pb.FetchPublishedRequest, context: Any
    ) -> AsyncIterator[cell_pb.PublishedChunk]:
        self.called.append("FetchPublished")
        for name in ("config.json", "model.safetensors"):
            yield cell_pb.PublishedChunk(name=name, last=True)


class _Scheduler(scheduler_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.notices: list[int] = []
        """The cell of each DrainCell that reached the handler."""

    async def Shutdown(
        self, request: scheduler_pb.ShutdownRequest, context: Any
    ) -> scheduler_pb.ShutdownResponse:
        return scheduler_pb.ShutdownResponse(cancelled=3)

    async def DrainCell(
        self, request: scheduler_pb.DrainCellRequest, context: Any
    ) -> scheduler_pb.DrainCellResponse:
        self.notices.append(request.cell)
        return scheduler_pb.DrainCellResponse(cell=request.cell)


async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _denied(call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as refusal:
        await call
    assert refusal.value.code() == grpc.StatusCode.PERMISSION_DENIED, refusal.value.details()
    return str(refusal.value.details())


async def test_only_the_allowed_identities_get_through(certs: Path, as_identity: None) -> None:
    tls.configure(tls.TlsFiles.under(certs, "cell_agent"))
    server, cell = new_server(), _Cell()
    cell_grpc.add_CellAgentServicer_to_server(cell, server)
    scheduler_grpc.add_SchedulerServicer_to_server(_Scheduler(), server)
    await add_health(server).set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.SERVING)
    unlisted = grpc.unary_unary_rpc_method_handler(_echo)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("gyre.test.Unlisted", {"Echo": unlisted}),)
    )
    port = bind(server, "127.0.0.1:0")
    await server.start()
    channels: dict[str, grpc.aio.Channel] = {}
    for identity in [*sorted(authz.IDENTITIES), "cell_agent-1"]:
        tls.configure(tls.TlsFiles.under(certs, identity))
        channels[identity] = aio_channel(f"127.0.0.1:{port}")
    try:
        await _check_calls(channels, cell)
    finally:
        for channel in channels.values():
            await channel.close()
        await server.stop(None)


async def _check_calls(channels: dict[str, grpc.aio.Channel], cell: _Cell) -> None:
    switch = cell_pb.SwitchRoleRequest(role=common_pb2.CELL_ROLE_TRAINING)
    role = await cell_grpc.CellAgentStub(channels["scheduler"]).SwitchRole(switch, timeout=10)
    assert role.role == common_pb2.CELL_ROLE_TRAINING
    details = await _denied(cell_grpc.CellAgentStub(channels["runner"]).SwitchRole(switch, timeout=10))
    assert "'runner'" in details and SWITCH_ROLE in details and "scheduler" in details
    assert cell.called == ["SwitchRole"], "a refused call never reaches the handler"
    with pytest.raises(grpc.aio.AioRpcError) as bad:  # domain errors still map, behind the check
        await cell_grpc.CellAgentStub(channels["scheduler"]).SwitchRole(
            cell_pb.SwitchRoleRequest(), timeout=10
        )
    assert (bad.value.code(), bad.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "no role")

    stop = scheduler_pb.ShutdownRequest(cancel_running=True)
    assert (await scheduler_grpc.SchedulerStub(channels["cli"]).Shutdown(stop, timeout=10)).cancelled == 3
    for identity in ("runner", "cell_agent", "scheduler"):
        details = await _denied(scheduler_grpc.SchedulerStub(channels[identity]).Shutdown(stop, timeout=10))
        assert f"'{identity}'" in details and SHUTDOWN in details

    fetch = cell_pb.FetchPublishedRequest(policy_version=1)  # a stream from an async generator
    chunks = [
        c.name
        async for c in cell_grpc.CellAgentStub(channels["cell_agent"]).FetchPublished(fetch, timeout=10)
    ]
    assert chunks == ["config.json", "model.safetensors"]
    details = await _denied(
        _drain(cell_grpc.CellAgentStub(channels["scheduler"]).FetchPublished(fetch, timeout=10))
    )
    assert "'scheduler'" in details and FETCH in details
    assert cell.called == ["SwitchRole", "SwitchRole", "FetchPublished"]

    watch = health_pb2_grpc.HealthStub(channels["runner"]).Watch(health_pb2.HealthCheckRequest(), timeout=10)
    first = await watch.read()  # a stream written with context.write
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()
    details = await _denied(
        _drain(
            health_pb2_grpc.HealthStub(channels["nats"]).Watch(health_pb2.HealthCheckRequest(), timeout=10)
        )
    )
    assert "'nats'" in details and WATCH in details

    def notice(identity: str, cell: int) -> Any:
        return scheduler_grpc.SchedulerStub(channels[identity]).DrainCell(
            scheduler_pb.DrainCellRequest(cell=cell), timeout=10
        )

    assert (await notice("cli", 2)).cell == 2, "an operator gives any cell notice"
    assert (await notice("cell_agent-1", 1)).cell == 1, "a cell gives its own"
    details = await _denied(notice("cell_agent-1", 2))  # cell 1's key sending cell 2 away
    assert "its own cell only" in details and "is cell 1's, not cell 2's" in details
    details = await _denied(notice("cell_agent", 1))  # a cell agent's certificate that names no cell
    assert "names no cell" in details
    assert "'runner'" in await _denied(notice("runner", 1))

    for identity in ("cli", "scheduler"):
        details = await _denied(channels[identity].unary_unary(UNLISTED)(b"hi", timeout=10))
        assert f"'{identity}'" in details and UNLISTED in details and "no entry" in details


async def _drain(call: Any) -> list[Any]:
    return [response async for response in call]


async def test_a_tls_port_needs_a_server_built_with_the_identity_configured(
    certs: Path, as_identity: None
) -> None:
    server = new_server()  # plaintext: no identity to check
    tls.configure(tls.TlsFiles.under(certs, "scheduler"))
    with pytest.raises(RuntimeError, match="before the TLS identity was configured"):
        bind(server, "127.0.0.1:0")


async def test_a_cell_gives_its_own_notice_as_itself(certs: Path, tmp_path: Path, as_identity: None) -> None:
    """`gyre cell notice` (a cell pod's preStop) dials the config's scheduler as the cell's own identity, mounted
    where a cell agent looks, and asks for the cell its certificate names; `--cell` of another cell is refused
    before anything is sent (that certificate is not its)."""
    import asyncio
    import shutil

    from typer.testing import CliRunner

    from app.cli import app

    tls.configure(tls.TlsFiles.under(certs, "scheduler"))
    server, scheduler = new_server(), _Scheduler()
    scheduler_grpc.add_SchedulerServicer_to_server(scheduler, server)
    port = bind(server, "127.0.0.1:0")
    await server.start()
    mounted = tmp_path / "tls"  # the pod's view: its own cell's secret at <tls.dir>/cell_agent
    shutil.copytree(certs / "cell_agent-1", mounted / "cell_agent")
    deployed = yaml.safe_load((REPO_ROOT / "deploy" / "compose" / "gyre.yaml").read_text())
    deployed["run"]["peer_hosts"]["scheduler"] = "127.0.0.1"
    deployed["scheduler"]["port"] = port
    deployed["tls"] = {"enabled": True, "dir": str(mounted)}
    config = tmp_path / "gyre.yaml"
    config.write_text(yaml.safe_dump(deployed))

    def notice(*extra: str) -> Any:
        return CliRunner().invoke(app, ["cell", "notice", "--config", str(config), "--timeout", "10", *extra])

    try:
        done = await asyncio.to_thread(notice)
        assert done.exit_code == 0 and "cell 1 left the pool" in done.output, done.output
        refused = await asyncio.to_thread(notice, "--cell", "2")
        assert refused.exit_code == 2 and "names cell 1, not cell 2" in refused.output, refused.output
        assert scheduler.notices == [1], "one notice, for the cell the certificate names"
    finally:
        await server.stop(None)
