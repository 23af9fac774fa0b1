"""The cells' collectives over mutual TLS: `cell_agent.trainer.dist_backend: tls`.

gloo and NCCL have no transport security in the torch wheels (gloo's TCP_TLS transport is not built in
them; the rendezvous TCPStore is plaintext), so a deployment whose cells' network is not private either
puts encryption below Gyre or uses this backend: Gyre's own star of TLS connections from every satellite
to the core, with the deployment's certificates (`gyre.tls`: the core asks for a client certificate the
CA signed and admits a connection that says it is cell k only with cell k's own certificate: the cell
agents' identity, `CELL_IDENTITY`, naming cell k (`gyre.tls.cell_uri`), so another service's certificate
cannot join and one cell cannot take another's place; satellites check the core's name and that its
certificate is cell 0's, `CORE_CELL`, so no other cell can pose as the core). The core handshakes incoming
connections concurrently and bounded (`MAX_HANDSHAKES`, `HANDSHAKE_S` each), so clients that connect and
stay silent cannot hold up the world's formation, and a connection claiming a place a live member holds is
refused. The three collectives the cells need are all rooted at the
core (`gyre.trainer.collectives`), so a star carries them with one hop each:

    reduce_to_core        each satellite of the prefix sends its tensor; the core adds them in cell
                          order, so the sum is g0 + g1 + … + g(n−1) left to right (the audit's order)
    broadcast_from_core   the core sends its tensor to each satellite of the prefix
    pair_broadcast        the core sends its tensor to one satellite (the `torch` weight transport)

Each satellite holds two connections, one for the prefix groups and one for its pair group (as gloo
gives every group its own), so a pull never interleaves with a step's reduction. Every message carries
its operation, its group and its byte count, and a receiver that expected another refuses it
(`StarError`), so ranks that disagree fail loudly instead of mixing bytes. A peer that dies, or stays
silent past the collective timeout, fails the collective in progress (`StarError`, a RuntimeError as
gloo's failures are), which the cell agent handles as it does a gloo failure: the world is re-formed.

CPU tensors only (the trainer's `device: cpu`); between GPUs, NCCL on a private network is the way.

    hub = StarHub.open(bind_host="0.0.0.0", port=0, generation=3, timeout_s=120)  # core, world g=3
    link = StarLink.connect(host="cell-agent-0", port=hub.port, cell=1, generation=3, timeout_s=5)
    groups = StarCellGroups.initialize(hub, cell=0, num_cells=K, timeout_s=600)      # core
    groups = StarCellGroups.initialize(link, cell=1, num_cells=K, timeout_s=600)     # satellite 1
"""

from __future__ import annotations

import queue
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gyre import tls
from gyre.log import get_logger

log = get_logger("gyre.trainer.star")

HELLO = struct.Struct("!4sQII")
"""A satellite's first bytes on a connection: magic, the world's generation, its cell, its channel."""
HELLO_MAGIC = b"GYRS"
OP = struct.Struct("!4sBIQ")
"""A collective's header: magic, operation, the group (participants, or the pair's satellite), bytes."""
OP_MAGIC = b"GYRO"
READY = b"\x01"
"""The core's answer on every connection once the whole world has connected."""
PREFIX, PAIR = 0, 1
CHANNELS = (PREFIX, PAIR)
REDUCE, BROADCAST, PAIR_BROADCAST = 1, 2, 3
_OP_NAMES = {REDUCE: "reduce_to_core", BROADCAST: "broadcast_from_core", PAIR_BROADCAST: "pair_broadcast"}
CHUNK = 4 * 2**20
"""Bytes of a satellite's tensor received (and added, for a reduction) at a time by the core."""
HANDSHAKE_S = 10.0
"""How long the core gives one incoming connection for its TLS handshake and hello."""
MAX_HANDSHAKES = 32
"""Incoming connections the core handshakes at once, each on its own thread: a client that connects and
stays silent holds one of them for at most HANDSHAKE_S and delays no other; past this many, a new
connection is closed at once (and a real satellite's retry comes later)."""
CELL_IDENTITY = tls.CELL_AGENT
"""The identity (certificate subject CN) a member of the star must have: `gyre.authz.CELL_AGENT`. Another
service's certificate of the same CA (a runner's, the proxy's) is refused, and so is a cell's certificate
for any place but its own cell's (`gyre.tls.certificate_cell`)."""
CORE_CELL = 0
"""The cell whose certificate the hub must show: the core, rank 0 of every world."""


class StarError(RuntimeError):
    """A collective or the world's formation failed: a peer died, was silent too long, or disagreed."""


def _context(server: bool, identity: tls.TlsFiles | None = None) -> ssl.SSLContext:
    """This cell's TLS context: `identity`, else this process's (`gyre.tls.current`)."""
    files = identity or tls.current()
    if files is None:
        raise StarError(
            "dist_backend tls needs this process's TLS identity (tls.enabled and `gyre tls init`)"
        )
    return files.server_context() if server else files.client_context()


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        raise StarError(
            f"dist_backend tls moves contiguous CPU tensors; got {tensor.device} {tuple(tensor.shape)}"
        )
    return memoryview(tensor.detach().view(-1).view(torch.uint8).numpy()).cast("B")


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], len(view) - got)
        if n == 0:
            raise ConnectionError("the peer closed the connection")
        got += n


def _recv(sock: socket.socket, nbytes: int) -> bytes:
    buffer = bytearray(nbytes)
    _recv_exact(sock, memoryview(buffer))
    return bytes(buffer)


@dataclass(slots=True)
class StarHub:
    """The core's listener of one world generation; `accept_world` takes the satellites' connections."""

    listener: socket.socket
    generation: int
    timeout_s: float
    context: ssl.SSLContext

    @classmethod
    def open(
        cls,
        *,
        bind_host: str,
        port: int,
        generation: int,
        timeout_s: float,
        identity: tls.TlsFiles | None = None,
    ) -> StarHub:
        context = _context(server=True, identity=identity)
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((bind_host, port))
            listener.listen(128)
        except OSError as e:
            listener.close()
            raise StarError(f"the core cannot listen on {bind_host}:{port}: {e}") from e
        return cls(listener, generation, timeout_s, context)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    @property
    def rendezvous(self) -> StarHub:
        """What `StarCellGroups.initialize` takes on the core: the hub itself."""
        return self

    def close(self) -> None:
        self.listener.close()

    def accept_world(self, num_cells: int) -> dict[tuple[int, int], ssl.SSLSocket]:
        """Every satellite's two connections of this generation; each is told READY once all are in.
        Connections are handshaken concurrently (`MAX_HANDSHAKES`); one that fails its handshake, has no
        cell agent's certificate or says a wrong hello is closed and waited past; a second connection for
        a (cell, channel) whose first is still alive is refused (a live member is never displaced), one
        whose first has gone takes its place (a satellite that connected again)."""
        expected = {(cell, channel) for cell in range(1, num_cells) for channel in CHANNELS}
        found: dict[tuple[int, int], ssl.SSLSocket] = {}
        admitted: queue.Queue[tuple[tuple[int, int], ssl.SSLSocket]] = queue.Queue()
        slots = threading.BoundedSemaphore(MAX_HANDSHAKES)
        formed = threading.Event()
        lock = threading.Lock()

        def handshake(raw: socket.socket, address: object) -> None:
            try:
                result = self._admit(raw, address, num_cells)
                if result is None:
                    return
                with lock:
                    if formed.is_set():  # the world formed (or failed) meanwhile: not a member
                        result[1].close()
                    else:
                        admitted.put(result)
            finally:
                slots.release()

        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                while not admitted.empty():
                    key, conn = admitted.get_nowait()
                    self._place(found, key, conn)
                if set(found) == expected:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(expected - set(found))
                    raise StarError(
                        f"world {self.generation}: no connection from (cell, channel) {missing} "
                        f"within {self.timeout_s:.0f} s"
                    )
                self.listener.settimeout(min(remaining, 0.05))
                try:
                    raw, address = self.listener.accept()
                except TimeoutError:
                    continue
                if not slots.acquire(blocking=False):
                    raw.close()
                    log.warning("star_handshakes_full", peer=str(address), max_handshakes=MAX_HANDSHAKES)
                    continue
                threading.Thread(
                    target=handshake, args=(raw, address), name="star-handshake", daemon=True
                ).start()
            with lock:
                formed.set()
            for conn in found.values():
                conn.sendall(READY)
        except (OSError, StarError) as e:
            with lock:
                formed.set()
            for conn in found.values():
                conn.close()
            while not admitted.empty():
                admitted.get_nowait()[1].close()
            if isinstance(e, StarError):
                raise
            raise StarError(f"world {self.generation}: {e}") from e
        return found

    @staticmethod
    def _place(
        found: dict[tuple[int, int], ssl.SSLSocket], key: tuple[int, int], conn: ssl.SSLSocket
    ) -> None:
        old = found.get(key)
        if old is not None and _alive(old):
            conn.close()
            log.warning("star_duplicate_refused", cell=key[0], channel=key[1])
            return
        if old is not None:
            old.close()
        found[key] = conn

    def _admit(
        self, raw: socket.socket, address: object, num_cells: int
    ) -> tuple[tuple[int, int], ssl.SSLSocket] | None:
        raw.settimeout(HANDSHAKE_S)
        try:
            conn = self.context.wrap_socket(raw, server_side=True)
        except OSError as e:  # no certificate, a wrong one, a plaintext client (ssl.SSLError is an OSError)
            raw.close()
            log.warning("star_connection_refused", peer=str(address), error=str(e)[:200])
            return None
        identity = certificate_identity(conn.getpeercert())
        if identity != CELL_IDENTITY:
            conn.close()
            log.warning("star_identity_refused", peer=str(address), identity=identity)
            return None
        try:
            magic, generation, cell, channel = HELLO.unpack(_recv(conn, HELLO.size))
        except (OSError, struct.error) as e:
            conn.close()
            log.warning("star_hello_failed", peer=str(address), error=str(e)[:200])
            return None
        if (
            magic != HELLO_MAGIC
            or generation != self.generation
            or not 1 <= cell < num_cells
            or channel not in CHANNELS
        ):
            conn.close()
            log.warning(
                "star_hello_refused", peer=str(address), generation=generation, cell=cell, channel=channel
            )
            return None
        certified = tls.certificate_cell(conn.getpeercert())
        if certified != cell:  # another cell's key (or a cell-less one) claiming this place
            conn.close()
            log.warning("star_cell_refused", peer=str(address), cell=cell, certificate_cell=certified)
            return None
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return (cell, channel), conn


def certificate_identity(cert: object) -> str | None:
    """The subject common name of a peer certificate as `ssl` decodes it (None without one)."""
    if not isinstance(cert, dict):
        return None
    names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
    return names[0] if len(names) == 1 else None


def _alive(conn: ssl.SSLSocket) -> bool:
    """A member that has said its hello sends nothing until READY: readable means it closed (or broke)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


@dataclass(slots=True)
class StarLink:
    """A satellite's two connections to the core's hub of one generation (READY not yet read)."""

    cell: int
    generation: int
    channels: dict[int, ssl.SSLSocket] = field(default_factory=dict)

    @classmethod
    def connect(
        cls,
        *,
        host: str,
        port: int,
        cell: int,
        generation: int,
        timeout_s: float,
        identity: tls.TlsFiles | None = None,
    ) -> StarLink:
        context = _context(server=False, identity=identity)
        link = cls(cell, generation)
        try:
            for channel in CHANNELS:
                raw = socket.create_connection((host, port), timeout=timeout_s)
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    conn = context.wrap_socket(raw, server_hostname=host)
                except BaseException:
                    raw.close()
                    raise
                link.channels[channel] = conn
                hub_cell = tls.certificate_cell(conn.getpeercert())
                if hub_cell != CORE_CELL:
                    raise ssl.SSLError(
                        f"the hub's certificate names {'no cell' if hub_cell is None else f'cell {hub_cell}'}, "
                        f"not the core's (cell {CORE_CELL})"
                    )
                conn.sendall(HELLO.pack(HELLO_MAGIC, generation, cell, channel))
        except OSError as e:
            link.close()
            raise StarError(f"cell {cell}: cannot reach the core's hub at {host}:{port}: {e}") from e
        return link

    def wait_ready(self, timeout_s: float) -> dict[int, ssl.SSLSocket]:
        try:
            for conn in self.channels.values():
                conn.settimeout(timeout_s)
                if _recv(conn, 1) != READY:
                    raise ConnectionError("the core's hub answered something other than READY")
        except OSError as e:  # ConnectionError and socket timeouts are OSErrors
            self.close()
            raise StarError(f"cell {self.cell}: world {self.generation} was not formed: {e}") from e
        return self.channels

    def close(self) -> None:
        for conn in self.channels.values():
            conn.close()


class StarCellGroups:
    """The cells' collectives over the star (the interface of `gyre.trainer.collectives.CellGroups`)."""

    def __init__(self, cell: int, num_cells: int, links: dict[tuple[int, int], ssl.SSLSocket]) -> None:
        self.cell = cell
        self.num_cells = num_cells
        self._links = links
        """Core: (satellite, channel) → connection; satellite: (0, channel) → its connection to the core."""

    @classmethod
    def initialize(
        cls, rendezvous: StarHub | StarLink, *, cell: int, num_cells: int, timeout_s: float
    ) -> StarCellGroups:
        """Form the world: the core accepts every satellite's connections, a satellite waits for READY."""
        if not 0 <= cell < num_cells:
            raise ValueError(f"cell {cell} is outside 0..{num_cells - 1}")
        if isinstance(rendezvous, StarHub):
            if cell != 0:
                raise ValueError("only the core (cell 0) hosts the star")
            links = rendezvous.accept_world(num_cells)
        else:
            ready = rendezvous.wait_ready(timeout_s)  # as gloo's init waits: up to one collective's timeout
            links = {(0, channel): conn for channel, conn in ready.items()}
        for conn in links.values():
            conn.settimeout(timeout_s)
        return cls(cell, num_cells, links)

    # ---- the collectives -------------------------------------------------------------------------

    def reduce_to_core(self, tensor: torch.Tensor, num_participants: int) -> None:
        """SUM `tensor` of the cells 0..n−1 into the core's copy, in cell order (the others' are unchanged)."""
        self._check_prefix(num_participants)
        if num_participants == 1:
            return
        data = _bytes_of(tensor)
        if self.cell != 0:
            self._send(PREFIX, REDUCE, num_participants, data)
            return
        flat = tensor.detach().view(-1)
        scratch = bytearray(min(CHUNK, len(data)))
        for satellite in range(1, num_participants):
            conn = self._conn(satellite, PREFIX)
            self._expect(conn, satellite, REDUCE, num_participants, len(data))
            offset = 0
            while offset < len(data):
                size = min(len(scratch), len(data) - offset)
                self._guard(satellite, REDUCE, _recv_exact, conn, memoryview(scratch)[:size])
                start = offset // tensor.element_size()
                part = torch.frombuffer(scratch, dtype=tensor.dtype, count=size // tensor.element_size())
                flat[start : start + part.numel()] += part
                offset += size

    def broadcast_from_core(self, tensor: torch.Tensor, num_participants: int) -> None:
        """Copy the core's `tensor` to the cells 1..n−1."""
        self._check_prefix(num_participants)
        if num_participants > 1:
            self._fan_out(PREFIX, BROADCAST, num_participants, range(1, num_participants), tensor)

    def pair_broadcast(self, tensor: torch.Tensor, satellite: int) -> None:
        """Copy the core's `tensor` to one satellite (called by the core and by that satellite)."""
        if self.cell not in (0, satellite) or not 1 <= satellite < self.num_cells:
            raise ValueError(f"cell {self.cell} is not in the pair (0, {satellite})")
        self._fan_out(PAIR, PAIR_BROADCAST, satellite, (satellite,), tensor)

    def close(self) -> None:
        for conn in self._links.values():
            conn.close()
        self._links = {}

    # ---- framing ---------------------------------------------------------------------------------

    def _check_prefix(self, num_participants: int) -> None:
        if not 1 <= num_participants <= self.num_cells:
            raise ValueError(f"a reduction needs 1..{self.num_cells} participants; got {num_participants}")
        if self.cell >= num_participants:
            raise ValueError(f"cell {self.cell} is not in the prefix 0..{num_participants - 1}")

    def _fan_out(
        self, channel: int, op: int, group: int, satellites: range | tuple[int, ...], tensor: torch.Tensor
    ) -> None:
        data = _bytes_of(tensor)
        if self.cell == 0:
            for satellite in satellites:
                self._send(channel, op, group, data, satellite)
            return
        conn = self._conn(0, channel)
        self._expect(conn, 0, op, group, len(data))
        self._guard(0, op, _recv_exact, conn, data)

    def _conn(self, peer: int, channel: int) -> ssl.SSLSocket:
        conn = self._links.get((peer, channel))
        if conn is None:
            raise StarError(f"cell {self.cell}: no connection with cell {peer} (the world is closed)")
        return conn

    def _send(self, channel: int, op: int, group: int, data: memoryview, satellite: int = 0) -> None:
        peer = satellite if self.cell == 0 else 0
        conn = self._conn(peer, channel)
        self._guard(peer, op, conn.sendall, OP.pack(OP_MAGIC, op, group, len(data)))
        self._guard(peer, op, conn.sendall, data)

    def _expect(self, conn: ssl.SSLSocket, peer: int, op: int, group: int, nbytes: int) -> None:
        header = bytearray(OP.size)
        self._guard(peer, op, _recv_exact, conn, memoryview(header))
        magic, got_op, got_group, got_bytes = OP.unpack(header)
        if (magic, got_op, got_group, got_bytes) != (OP_MAGIC, op, group, nbytes):
            raise StarError(
                f"cell {self.cell}: expected {_OP_NAMES[op]} of group {group} ({nbytes} bytes) from cell {peer}; "
                f"got {_OP_NAMES.get(got_op, f'operation {got_op}')} of group {got_group} ({got_bytes} bytes)"
            )

    def _guard(self, peer: int, op: int, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except OSError as e:  # ConnectionError, socket timeouts and ssl.SSLError are OSErrors
            raise StarError(f"cell {self.cell}: {_OP_NAMES[op]} with cell {peer} failed: {e}") from e
