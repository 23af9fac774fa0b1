"""A packet capture of the TCP connections on one network interface, each classified by the first bytes
its client sent: a TLS ClientHello or anything else. `gyre bench cluster` runs it on its compose network's
bridge for the whole run, an audit of the wire independent of what any server says about itself.

    sniffer = Sniffer("cni-podman3").start()       # an AF_PACKET socket (root), in a thread of its own
    ...                                             # the traffic
    flows = sniffer.stop()                          # every TCP connection seen, in order of first packet
    report = summarize(flows, names={"10.89.0.2": "nats", ...}, local=ipaddress.ip_network("10.89.0.0/24"))

A connection is classified only when its opening was captured: the client's SYN (or the server's SYN-ACK)
gives the client's initial sequence number, and the first client segment must start right after it (seq =
ISN + 1), so a connection open before the capture began, or one whose first data segment was lost, is
`unknown start`, never guessed. `tls`: that segment is a TLS handshake record (0x16 0x03 0x00–0x04) holding a
ClientHello (handshake type 1); `plaintext`: any other bytes; `no payload`: the client sent nothing (a
connection refused — `refused`: the server's reset answered the SYN — or opened and closed). A server that speaks first (NATS's INFO before its client's TLS
handshake) is recorded with its own first bytes: such a preamble is plaintext on the wire too.

Bounded: only the first `SNAP` bytes of each packet are copied out of the kernel, each flow keeps its first
`FIRST_BYTES` payload bytes per direction, counts bytes and packets, and at most `MAX_FLOWS` flows are kept
(the rest are counted). The interface is put in promiscuous mode for the socket's life (a bridge passes the
frames it forwards between its ports to its own taps only then); the kernel drops that when the socket closes.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800
SOL_PACKET, PACKET_ADD_MEMBERSHIP, PACKET_MR_PROMISC, PACKET_STATISTICS = 263, 1, 1, 6
PACKET_OUTGOING = 4
SO_RCVBUFFORCE, RCVBUF = 33, 16 << 20
SNAP = 256
"""Bytes copied per packet: Ethernet (14) + the largest IPv4 (60) and TCP (60) headers leave >= 122 payload."""
FIRST_BYTES = 16
MAX_FLOWS = 100_000
DRAIN_S = 5.0
"""After `stop()`, how long the packets already queued in the socket may take to be read."""
SYN, RST, FIN, ACK = 0x02, 0x04, 0x01, 0x10

TLS, PLAINTEXT, NO_PAYLOAD, UNKNOWN_START = "tls", "plaintext", "no payload", "unknown start"


def classify_first_bytes(data: bytes) -> str:
    """`tls` for a TLS record carrying a ClientHello (content type 22 handshake, version 3.0–3.4 on the
    record, handshake type 1), else `plaintext`; `no payload` for nothing."""
    if not data:
        return NO_PAYLOAD
    if len(data) >= 6 and data[0] == 0x16 and data[1] == 0x03 and data[2] <= 0x04 and data[5] == 0x01:
        return TLS
    return PLAINTEXT


TCPSTORE_VALIDATE = bytes([0]) + (0x3C85F7CE).to_bytes(4, "little")
"""torch's TCPStore client opens with QueryType::VALIDATE (0) and its magic number 0x3C85F7CE
(torch/csrc/distributed/c10d/TCPStoreBackend.hpp)."""
HTTP_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ")


def looks_like(data: bytes) -> str:
    """What a connection's first client bytes are, where they carry an exact signature: a TLS ClientHello,
    torch's TCPStore handshake, HTTP/1 or HTTP/2 in the clear; else `unrecognized`."""
    if classify_first_bytes(data) == TLS:
        return "tls client hello"
    if data.startswith(TCPSTORE_VALIDATE):
        return "torch TCPStore"
    if data.startswith(b"PRI * HTTP/2"):
        return "http/2 cleartext"
    if data.startswith(HTTP_METHODS):
        return "http/1"
    return "unrecognized" if data else ""


Endpoint = tuple[str, int]


@dataclass(slots=True)
class Flow:
    """One TCP connection as the capture saw it."""

    client: Endpoint
    server: Endpoint
    opened: bool
    """The SYN (or SYN-ACK) was captured: `client`/`server` and `isn` are known, not guessed."""
    isn: int = 0
    """The client's initial sequence number."""
    client_first: bytes = b""
    server_first: bytes = b""
    server_spoke_first: bool = False
    start_missed: bool = False
    """The first client segment seen did not start at ISN + 1: its beginning was not captured."""
    closed: bool = False
    accepted: bool = False
    """The server's SYN-ACK was captured."""
    refused: bool = False
    """The server answered the SYN with a reset (nothing listened)."""
    packets: int = 0
    bytes_to_server: int = 0
    bytes_to_client: int = 0

    @property
    def kind(self) -> str:
        if not self.opened or self.start_missed:
            return UNKNOWN_START
        return classify_first_bytes(self.client_first)


@dataclass(slots=True)
class _Stats:
    packets: int = 0
    flows_over_limit: int = 0
    kernel_drops: int = 0
    cpu_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class Sniffer:
    """Capture TCP/IPv4 on `interface` in a thread until `stop()`."""

    def __init__(self, interface: str) -> None:
        self.interface = interface
        self.flows: list[Flow] = []
        self.stats = _Stats()
        self._open: dict[tuple[Endpoint, Endpoint], Flow] = {}
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._skip_outgoing = interface == "lo"
        """On the loopback every packet passes twice, out and back in: keep one of them."""

    def start(self, timeout_s: float = 10.0) -> Sniffer:
        """Open the socket (raises PermissionError without root, OSError for no such interface) and start
        the thread; returns once the socket is bound, so traffic from then on is seen."""
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        try:
            try:  # root may exceed net.core.rmem_max: room for bursts between the thread's reads
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.bind((self.interface, ETH_P_ALL))
            ifindex = socket.if_nametoindex(self.interface)
            mreq = struct.pack("iHH8s", ifindex, PACKET_MR_PROMISC, 0, b"")
            sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
            sock.settimeout(0.2)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._thread = threading.Thread(target=self._run, name=f"sniff-{self.interface}", daemon=True)
        self._thread.start()
        self._bound.wait(timeout_s)
        return self

    def stop(self) -> list[Flow]:
        """End the capture (idempotent): the thread is joined and the socket closed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                self.stats.errors.append("capture thread still running 10 s after stop")
        return self.flows

    @property
    def thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        assert self._sock is not None
        cpu0 = time.thread_time()
        buf = bytearray(SNAP)
        view = memoryview(buf)
        self._bound.set()
        try:
            drain_until = None
            while True:
                if drain_until is None and self._stop.is_set():
                    # What the kernel queued before stop() is part of the capture: read it out, then end.
                    drain_until = time.monotonic() + DRAIN_S
                    self._sock.setblocking(False)
                if drain_until is not None and time.monotonic() > drain_until:
                    self.stats.errors.append(f"still draining {DRAIN_S:.0f} s after stop")
                    break
                try:
                    n, address = self._sock.recvfrom_into(buf, SNAP)
                except (TimeoutError, BlockingIOError):
                    if drain_until is not None:
                        break
                    continue
                except OSError as e:  # the interface went away (the network was removed)
                    self.stats.errors.append(f"{type(e).__name__}: {e}")
                    break
                if self._skip_outgoing and address[2] == PACKET_OUTGOING:
                    continue
                self.stats.packets += 1
                self._packet(view[:n])
            self._kernel_stats()
        finally:
            self._sock.close()
            self.stats.cpu_s = round(time.thread_time() - cpu0, 3)

    def _kernel_stats(self) -> None:
        assert self._sock is not None
        try:
            raw = self._sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
            self.stats.kernel_drops = struct.unpack("II", raw)[1]  # tp_packets, tp_drops
        except OSError as e:
            self.stats.errors.append(f"PACKET_STATISTICS: {e}")

    def _packet(self, pkt: memoryview) -> None:
        if len(pkt) < 34 or (pkt[12] << 8 | pkt[13]) != ETH_P_IP:
            return
        ihl = (pkt[14] & 0x0F) * 4
        if pkt[23] != 6 or len(pkt) < 14 + ihl + 20:  # not TCP
            return
        total = pkt[16] << 8 | pkt[17]
        src, dst = socket.inet_ntoa(pkt[26:30]), socket.inet_ntoa(pkt[30:34])
        t = 14 + ihl
        sport, dport, seq, ack = struct.unpack_from("!HHII", pkt, t)
        doff = (pkt[t + 12] >> 4) * 4
        flags = pkt[t + 13]
        size = max(0, total - ihl - doff)
        payload = bytes(pkt[t + doff : t + doff + min(size, FIRST_BYTES)])
        self._track((src, sport), (dst, dport), seq, ack, flags, size, payload)

    def _track(
        self, a: Endpoint, b: Endpoint, seq: int, ack: int, flags: int, size: int, payload: bytes
    ) -> None:
        flow = self._open.get((a, b)) or self._open.get((b, a))
        syn_only = flags & SYN and not flags & ACK
        if syn_only and flow is not None and (flow.closed or flow.client_first or not flow.opened):
            flow = None  # the 4-tuple reused by a new connection
        if flow is None:
            if len(self.flows) >= MAX_FLOWS:
                self.stats.flows_over_limit += 1
                return
            if syn_only:
                flow = Flow(client=a, server=b, opened=True, isn=seq)
            elif flags & SYN and flags & ACK:  # the SYN-ACK: the client is the receiver
                flow = Flow(client=b, server=a, opened=True, isn=(ack - 1) & 0xFFFFFFFF)
            else:
                flow = Flow(client=a, server=b, opened=False)
            self.flows.append(flow)
            self._open[(flow.client, flow.server)] = flow
        flow.packets += 1
        to_server = a == flow.client
        if flags & SYN and flags & ACK:
            flow.accepted = True
        if flags & RST and not to_server and flow.opened and not flow.accepted:
            flow.refused = True
        if flags & (FIN | RST):
            flow.closed = True
        if to_server:
            flow.bytes_to_server += size
        else:
            flow.bytes_to_client += size
        if size == 0:
            return
        if to_server and not flow.client_first:
            flow.client_first = payload
            if flow.opened and seq != (flow.isn + 1) & 0xFFFFFFFF:
                flow.start_missed = True
        elif not to_server and not flow.server_first:
            flow.server_first = payload
            flow.server_spoke_first = not flow.client_first


def summarize(
    flows: list[Flow],
    names: dict[str, str],
    local: list[ipaddress.IPv4Network] | None = None,
    exclude: set[str] | None = None,
) -> dict[str, Any]:
    """The flows between two addresses of `local` (both ends; all flows when None), neither in `exclude`
    (the bridge's gateway: the host's published ports), grouped by (client, server, server port) with
    `names` for the addresses. `all_tls`: at least one flow, each one that carried data opened with a TLS
    ClientHello, none of unknown start."""
    exclude = exclude or set()

    def inside(ip: str) -> bool:
        if ip in exclude:
            return False
        return local is None or any(ipaddress.ip_address(ip) in net for net in local)

    between = [f for f in flows if inside(f.client[0]) and inside(f.server[0])]
    groups: dict[str, dict[tuple[str, str, int], dict[str, Any]]] = {}
    for f in between:
        key = (names.get(f.client[0], f.client[0]), names.get(f.server[0], f.server[0]), f.server[1])
        g = groups.setdefault(f.kind, {}).setdefault(
            key,
            {
                "client": key[0],
                "server": key[1],
                "port": key[2],
                "flows": 0,
                "bytes": 0,
                "first_bytes_hex": f.client_first.hex(),
                "looks_like": looks_like(f.client_first),
            },
        )
        g["flows"] += 1
        g["bytes"] += f.bytes_to_server + f.bytes_to_client
        g["refused"] = g.get("refused", 0) + int(f.refused)
    spoke_first: dict[tuple[str, int, str], int] = {}
    for f in between:
        if f.server_spoke_first and f.server_first:
            key3 = (names.get(f.server[0], f.server[0]), f.server[1], f.server_first.hex())
            spoke_first[key3] = spoke_first.get(key3, 0) + 1
    counts = {
        kind: sum(1 for f in between if f.kind == kind)
        for kind in (TLS, PLAINTEXT, NO_PAYLOAD, UNKNOWN_START)
    }

    def listed(kind: str) -> list[dict[str, Any]]:
        return sorted(groups.get(kind, {}).values(), key=lambda g: (-g["bytes"], g["client"], g["port"]))

    return {
        "flows": len(between),
        "tls": counts[TLS],
        "plaintext_flows": counts[PLAINTEXT],
        "no_payload": counts[NO_PAYLOAD],
        "unknown_start_flows": counts[UNKNOWN_START],
        "bytes": sum(f.bytes_to_server + f.bytes_to_client for f in between),
        "plaintext_bytes": sum(f.bytes_to_server + f.bytes_to_client for f in between if f.kind == PLAINTEXT),
        "plaintext": listed(PLAINTEXT),
        "unknown_start": listed(UNKNOWN_START),
        "tls_channels": [{k: g[k] for k in ("client", "server", "port", "flows")} for g in listed(TLS)],
        "no_payload_channels": [
            {k: g[k] for k in ("client", "server", "port", "flows", "refused")} for g in listed(NO_PAYLOAD)
        ],
        "server_spoke_first": [
            {"server": server, "port": port, "flows": n, "first_bytes_hex": first}
            for (server, port, first), n in sorted(spoke_first.items())
        ],
        "other_flows": len(flows) - len(between),
        "all_tls": bool(between) and counts[PLAINTEXT] == 0 and counts[UNKNOWN_START] == 0,
    }


class NetworkCapture:
    """A `Sniffer` on a container network's bridge from the moment it exists: `lookup()` answers the
    network's `podman network inspect` (None until the network is made); the bridge device itself appears
    only when the first container joins, and the capture binds to it within `POLL_S` of that."""

    POLL_S = 0.01

    def __init__(self, lookup: Callable[[], dict[str, Any] | None], timeout_s: float = 600.0) -> None:
        self._lookup = lookup
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self.network: dict[str, Any] = {}
        self.sniffer: Sniffer | None = None
        self.error = ""
        self._thread = threading.Thread(target=self._attach, name="capture-attach", daemon=True)

    def start(self) -> NetworkCapture:
        self._thread.start()
        return self

    def _attach(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                info = self._lookup()
                if info is not None:
                    self.network = info
                    break
                self._stop.wait(0.2)
            interface = str(self.network.get("network_interface", ""))
            if not interface:
                self.error = "the network never appeared" if not self.network else "no network_interface"
                return
            while not self._stop.is_set() and time.monotonic() < deadline:
                if Path("/sys/class/net", interface).exists():
                    self.sniffer = Sniffer(interface).start()
                    return
                self._stop.wait(self.POLL_S)
            self.error = self.error or f"{interface} never appeared"
        except Exception as e:  # reported with the capture's result; the run goes on without it
            self.error = f"{type(e).__name__}: {e}"

    def stop(self) -> list[Flow]:
        """End the capture (idempotent); the flows seen, none when it never started (`error` says why)."""
        self._stop.set()
        self._thread.join(timeout=30)
        return self.sniffer.stop() if self.sniffer is not None else []

    def report(self, names: dict[str, str]) -> dict[str, Any]:
        """`summarize` of the flows between the network's containers (the gateway, the host's side of the
        published ports, left out), with what the capture itself cost and saw."""
        flows = self.stop()
        subnets = [
            ipaddress.ip_network(s["subnet"]) for s in self.network.get("subnets", []) if "subnet" in s
        ]
        gateways = {str(s["gateway"]) for s in self.network.get("subnets", []) if s.get("gateway")}
        if self.sniffer is None:
            return {"interface": "", "error": self.error or "not started", "flows": 0, "all_tls": False}
        st = self.sniffer.stats
        return {
            "interface": self.sniffer.interface,
            **summarize(flows, names, subnets, gateways),
            "packets": st.packets,
            "kernel_drops": st.kernel_drops,
            "flows_over_limit": st.flows_over_limit,
            "cpu_s": st.cpu_s,
            "errors": st.errors,
        }
