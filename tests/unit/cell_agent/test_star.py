"""`dist_backend: tls`: the cells' collectives over Gyre's star of mutual-TLS connections (gyre.trainer.star),
three cells as threads of this process on loopback, with certificates from `gyre tls init`'s issuer.

The core's sum is the cells' tensors added in cell order (what the audit replays, bit for bit), over
buffers larger than the core's receive chunk; broadcasts and the pair broadcast reach exactly their
cells; a dead satellite fails the collective it was part of and not a smaller prefix's; a client without
a certificate, with one of another CA, with another service's of the same CA, with another cell's, in
plaintext or of another world generation is refused while the world still forms; a satellite refuses a hub
whose certificate is not the core's (another CA's, or another cell's posing as the core); connections that stay silent do not hold it up;
a live member is never displaced; ranks that disagree on the collective fail instead of mixing bytes."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gyre import authz, tls
from gyre.config import ConfigError, load_config
from gyre.trainer import star
from gyre.trainer.collectives import host_rendezvous, initialize_groups, join_rendezvous
from gyre.trainer.star import (
    CELL_IDENTITY,
    CHUNK,
    HELLO,
    HELLO_MAGIC,
    PREFIX,
    StarCellGroups,
    StarError,
    StarHub,
    StarLink,
)

GENERATION = 4
TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tls")
    tls.issue(out, {"cell_agent-0": ["cell-agent-0"], "cell_agent-1": [], "cell_agent-2": [], "cli": []})
    tls.issue(out / "other", {"cell_agent-0": ["cell-agent-0"], "cell_agent-1": []})  # a CA not trusted
    return out


@pytest.fixture
def as_cell_agent(certs: Path) -> Iterator[None]:
    tls.configure(_cell(0, certs))  # the core's; each satellite joins with its own cell's (`_cell`)
    yield
    tls.configure(None)


def _cell(cell: int, certs: Path | None = None) -> tls.TlsFiles:
    """Cell `cell`'s own certificate (`certs`: the deployment's directory, else the one in use)."""
    if certs is None:
        current = tls.current()
        assert current is not None
        certs = current.cert.parent.parent
    return tls.TlsFiles.under(certs, tls.cell_directory(cell))


def _in_threads(fns: dict[int, Callable[[], Any]], timeout_s: float = 60.0) -> dict[int, Any]:
    """Run each cell's body on its own thread; a body's exception is its result."""
    results: dict[int, Any] = {}

    def body(cell: int, fn: Callable[[], Any]) -> None:
        try:
            results[cell] = fn()
        except Exception as e:  # the test looks at it
            results[cell] = e

    threads = [threading.Thread(target=body, args=(c, fn), daemon=True) for c, fn in fns.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        assert not t.is_alive(), "a cell's collective hung"
    return results


def _world(num_cells: int = 3) -> dict[int, StarCellGroups]:
    hub = host_rendezvous(
        "tls", bind_host="127.0.0.1", port=0, world_size=num_cells, generation=GENERATION, timeout_s=TIMEOUT_S
    )
    assert isinstance(hub, StarHub)

    def join(cell: int) -> Callable[[], Any]:
        def run() -> Any:
            if cell == 0:
                return initialize_groups(
                    hub.rendezvous, cell=0, num_cells=num_cells, backend="tls", timeout_s=TIMEOUT_S
                )
            link = _join(hub.port, cell=cell, num_cells=num_cells, identity=_cell(cell))
            return initialize_groups(link, cell=cell, num_cells=num_cells, backend="tls", timeout_s=TIMEOUT_S)

        return run

    groups = _in_threads({c: join(c) for c in range(num_cells)})
    hub.close()
    assert all(isinstance(g, StarCellGroups) for g in groups.values()), groups
    return groups


def test_reduce_is_the_cell_order_sum_and_broadcasts_reach_their_cells(as_cell_agent: None) -> None:
    world = _world(3)
    numel = CHUNK // 4 * 2 + 1234  # float32: more than two of the core's receive chunks
    grads = {
        c: torch.randn(numel, generator=torch.Generator().manual_seed(c)) * 10 ** (c - 1) for c in range(3)
    }
    expected = grads[0] + grads[1] + grads[2]  # left to right, as the audit's replay sums them
    params = {c: torch.full((1000,), 7.0) if c == 0 else torch.zeros(1000) for c in range(3)}
    pair = {c: torch.arange(6.0) if c == 0 else torch.zeros(6) for c in range(3)}

    def cell(c: int) -> Callable[[], None]:
        def run() -> None:
            world[c].reduce_to_core(grads[c], 3)
            world[c].broadcast_from_core(params[c], 3)
            if c in (0, 2):
                world[c].pair_broadcast(pair[c], 2)

        return run

    sent = {c: grads[c].clone() for c in (1, 2)}
    assert _in_threads({c: cell(c) for c in range(3)}) == {0: None, 1: None, 2: None}
    assert torch.equal(grads[0], expected), "the core holds g0 + g1 + g2 added in cell order, bit for bit"
    assert torch.equal(grads[1], sent[1]) and torch.equal(grads[2], sent[2]), "satellites' copies untouched"
    assert all(torch.equal(params[c], torch.full((1000,), 7.0)) for c in range(3))
    assert torch.equal(pair[2], torch.arange(6.0)) and torch.equal(pair[1], torch.zeros(6)), (
        "pair {0, 2} only"
    )

    bf16 = {c: torch.randn(333, generator=torch.Generator().manual_seed(9 + c)).bfloat16() for c in range(2)}
    want = bf16[0] + bf16[1]
    _in_threads({c: (lambda c=c: world[c].reduce_to_core(bf16[c], 2)) for c in range(2)})
    assert torch.equal(bf16[0], want), "any dtype: bfloat16 over a prefix of two"
    for g in world.values():
        g.close()


def test_a_dead_satellite_fails_its_collective_and_not_a_smaller_prefix(as_cell_agent: None) -> None:
    world = _world(3)
    world[2].close()  # cell 2's process died: its connections close
    ones = {c: torch.ones(10) * (c + 1) for c in range(2)}
    _in_threads({c: (lambda c=c: world[c].reduce_to_core(ones[c], 2)) for c in range(2)})
    assert torch.equal(ones[0], torch.full((10,), 3.0)), "the prefix {0, 1} keeps working"

    results = _in_threads(
        {
            0: lambda: world[0].reduce_to_core(torch.ones(10), 3),
            1: lambda: world[1].reduce_to_core(torch.ones(10), 3),
        }
    )
    assert isinstance(results[0], StarError) and "cell 2" in str(results[0]), results
    assert isinstance(results[0], RuntimeError), "handled like a gloo failure: the world is re-formed"
    for g in world.values():
        g.close()


def test_ranks_that_disagree_fail_instead_of_mixing_bytes(as_cell_agent: None) -> None:
    world = _world(2)
    results = _in_threads(
        {
            0: lambda: world[0].broadcast_from_core(torch.zeros(8), 2),
            1: lambda: world[1].broadcast_from_core(torch.zeros(9), 2),
        }
    )
    assert (
        isinstance(results[1], StarError) and "32 bytes" in str(results[1]) and "36 bytes" in str(results[1])
    )
    for g in world.values():
        g.close()


def _refused(client: Callable[[int], None], hub: StarHub) -> None:
    """The world of two forms although `client` dialled the hub first."""
    done = threading.Event()

    def stray() -> None:
        try:
            client(hub.port)
        finally:
            done.set()

    def satellite() -> StarCellGroups:
        assert done.wait(TIMEOUT_S)
        return _satellite_of_two(hub)

    results = _in_threads(
        {
            0: lambda: StarCellGroups.initialize(hub, cell=0, num_cells=2, timeout_s=TIMEOUT_S),
            1: satellite,
            2: stray,
        }
    )
    assert isinstance(results[0], StarCellGroups) and isinstance(results[1], StarCellGroups), results
    assert results[2] is None, f"the stray client was not refused as expected: {results[2]!r}"
    results[0].close()
    results[1].close()


def _satellite_of_two(hub: StarHub) -> StarCellGroups:
    """Cell 1 of a world of two, joining `hub`."""
    link = _join(hub.port, cell=1, num_cells=2, identity=_cell(1))
    assert isinstance(link, StarLink)
    return StarCellGroups.initialize(link, cell=1, num_cells=2, timeout_s=TIMEOUT_S)


def _join(
    port: int, *, cell: int, num_cells: int, identity: tls.TlsFiles, timeout_s: float = 5.0
) -> StarLink | Any:
    """Cell `cell`'s side of the hub's rendezvous on `port`, with `identity`'s certificate."""
    return join_rendezvous(
        "tls",
        host="127.0.0.1",
        port=port,
        world_size=num_cells,
        cell=cell,
        generation=GENERATION,
        timeout_s=timeout_s,
        identity=identity,
    )


def _tls_client(context: ssl.SSLContext, port: int) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


@pytest.mark.parametrize(
    "who",
    ["no certificate", "another CA", "plaintext", "another generation", "another service", "another cell"],
)
def test_the_hub_refuses_clients_without_the_deployments_certificate(
    who: str, certs: Path, as_cell_agent: None
) -> None:
    def client(port: int) -> None:
        if who == "plaintext":
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(HELLO.pack(HELLO_MAGIC, GENERATION, 1, PREFIX))
                try:
                    answer = s.recv(1)
                except ConnectionResetError:
                    answer = b""
                assert answer in (b"", b"\x15"), "no READY for a plaintext client"  # closed or a TLS alert
            return
        if who in ("another generation", "another service", "another cell"):
            # cli: the same CA's, not a cell's; cell 2's certificate saying it is cell 1; cell 1's own
            identity = {"another service": "cli", "another cell": "cell_agent-2"}.get(who, "cell_agent-1")
            conn = _tls_client(tls.TlsFiles.under(certs, identity).client_context(), port)
            conn.sendall(HELLO.pack(HELLO_MAGIC, GENERATION - (who == "another generation"), 1, PREFIX))
            try:
                answer = conn.recv(1)
            except (ssl.SSLError, ConnectionError):
                answer = b""
            assert answer == b"", f"the hub closes a connection of {who}"
            conn.close()
            return
        if who == "no certificate":
            context = ssl.create_default_context(cafile=str(certs / "cell_agent-1" / tls.CA_FILE))
        else:
            context = tls.TlsFiles.under(certs / "other", "cell_agent-1").client_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            conn = _tls_client(context, port)
            conn.sendall(HELLO.pack(HELLO_MAGIC, GENERATION, 1, PREFIX))
            if conn.recv(1) == b"":  # TLS 1.3: the refusal may arrive after the client's handshake
                raise ConnectionError("closed")

    hub = StarHub.open(bind_host="127.0.0.1", port=0, generation=GENERATION, timeout_s=TIMEOUT_S)
    try:
        _refused(client, hub)
    finally:
        hub.close()


def test_the_star_admits_the_cell_agents_identity_of_the_authorization_table() -> None:
    assert CELL_IDENTITY == authz.CELL_AGENT


def test_idle_connections_do_not_stall_the_worlds_formation(
    as_cell_agent: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients that connect and say nothing each hold a handshake slot for up to HANDSHAKE_S (set to 60 s
    here, past the formation's 20 s, so the hub cannot have closed them first however slow this machine);
    the world forms meanwhile, while they are all still open (handshakes are concurrent: one at a time, the
    first of them would hold the formation past its timeout)."""
    monkeypatch.setattr(star, "HANDSHAKE_S", 60.0)
    hub = StarHub.open(bind_host="127.0.0.1", port=0, generation=GENERATION, timeout_s=TIMEOUT_S)
    idle = [socket.create_connection(("127.0.0.1", hub.port), timeout=5) for _ in range(8)]
    try:
        results = _in_threads(
            {
                0: lambda: StarCellGroups.initialize(hub, cell=0, num_cells=2, timeout_s=TIMEOUT_S),
                1: lambda: _satellite_of_two(hub),
            }
        )
        assert all(isinstance(r, StarCellGroups) for r in results.values()), results
        for s in idle:  # not yet closed by the hub: the world did not wait for any of them
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
        for g in results.values():
            g.close()
    finally:
        for s in idle:
            s.close()
        hub.close()


def test_a_live_member_is_not_displaced_by_a_second_hello_for_its_cell() -> None:
    """The hub's rule for a second connection claiming a (cell, channel) it already holds: refused (closed)
    while the first is alive — a member that said its hello sends nothing until READY, so it is alive while
    it has nothing to read — and taking the place of a first that closed (a satellite that connected
    again)."""
    live, live_peer = socket.socketpair()
    second, second_peer = socket.socketpair()
    found = {(1, PREFIX): live}
    StarHub._place(found, (1, PREFIX), second)  # type: ignore[arg-type]
    assert found[(1, PREFIX)] is live and second.fileno() == -1, "the live member stays, the second is closed"
    live_peer.close()  # the first member's end goes away: its socket reads EOF
    third, third_peer = socket.socketpair()
    StarHub._place(found, (1, PREFIX), third)  # type: ignore[arg-type]
    assert found[(1, PREFIX)] is third and live.fileno() == -1, "a closed member's place is taken"
    for sock in (third, second_peer, third_peer):
        sock.close()


@pytest.mark.parametrize("core", ["another CA", "another cell"])
def test_a_satellite_refuses_a_hub_that_is_not_the_cores(core: str, certs: Path, as_cell_agent: None) -> None:
    """The hub's certificate must be cell 0's of the deployment's CA: another CA's is refused by the
    handshake, and a cell of the same CA posing as the core (cell 2's key) by its cell."""
    impostor = _cell(0, certs / "other") if core == "another CA" else _cell(2, certs)
    hub = StarHub.open(bind_host="127.0.0.1", port=0, generation=GENERATION, timeout_s=3.0, identity=impostor)
    try:
        results = _in_threads(
            {
                0: lambda: StarCellGroups.initialize(hub, cell=0, num_cells=2, timeout_s=3.0),
                1: lambda: _join(hub.port, cell=1, num_cells=2, identity=_cell(1, certs), timeout_s=3.0),
            }
        )
    finally:
        hub.close()
    why = "certificate" if core == "another CA" else "names cell 2, not the core's"
    assert isinstance(results[1], StarError) and why in str(results[1]).lower(), results
    assert isinstance(results[0], StarError) and "no connection" in str(results[0]), results


def test_the_star_needs_a_tls_identity_and_a_cpu_trainer(tmp_path: Path) -> None:
    with pytest.raises(StarError, match="TLS identity"):
        StarHub.open(bind_host="127.0.0.1", port=0, generation=1, timeout_s=1.0)
    config = tmp_path / "gyre.yaml"
    config.write_text("cell_agent: {trainer: {dist_backend: tls}}\n")
    with pytest.raises(ConfigError, match=r"dist_backend tls needs tls\.enabled"):
        load_config(config)
    config.write_text("cell_agent: {trainer: {dist_backend: tls, device: cuda}}\n")
    with pytest.raises(ConfigError, match="dist_backend tls moves CPU tensors"):
        load_config(config)
