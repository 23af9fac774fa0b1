"""The packet capture `gyre bench cluster` audits its network with (bench/_capture.py), on real traffic: an
AF_PACKET socket on the loopback, a real TLS connection (python's ssl, mutual TLS with certificates from
`gyre.tls.issue`, as `gyre tls init` writes them), a plaintext one, one opened before the capture began, and
one the server refuses; each must come out as what it was.

Needs root (an AF_PACKET socket); outside CI a machine without it skips with the reason, under CI=true it
fails.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._capture import (
    NO_PAYLOAD,
    PLAINTEXT,
    TLS,
    UNKNOWN_START,
    Sniffer,
    classify_first_bytes,
    looks_like,
    summarize,
)
from gyre import tls
from tests.support.sandboxes import unavailable


def _root_or_skip() -> None:
    if os.geteuid() != 0:
        unavailable("the capture needs root (an AF_PACKET socket)")  # a failure under CI


class _Server:
    """A TCP server on 127.0.0.1 that answers every line it reads with `ok`, over TLS when `context`."""

    def __init__(self, context: ssl.SSLContext | None) -> None:
        self.context = context
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            with conn, conn.makefile("rwb") as f:
                for _ in f:
                    f.write(b"ok\n")
                    f.flush()
        except (OSError, ssl.SSLError) as e:
            self.errors.append(e)

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        self.listener.close()
        self.thread.join(timeout=10)


def _exchange(sock: socket.socket, line: bytes) -> None:
    sock.sendall(line)
    assert sock.recv(16).startswith(b"ok")


@pytest.fixture
def identity(tmp_path: Path) -> tls.TlsFiles:
    tls.issue(tmp_path / "tls", {"server": ["server"]})
    return tls.TlsFiles.under(tmp_path / "tls", "server")


@pytest.fixture
def servers(identity: tls.TlsFiles) -> Iterator[tuple[_Server, _Server]]:
    secure, plain = _Server(identity.server_context()), _Server(None)
    yield secure, plain
    secure.close()
    plain.close()


def test_first_bytes_tell_a_client_hello_from_anything_else() -> None:
    hello = bytes.fromhex("160301020001") + b"\x00" * 10
    assert classify_first_bytes(hello) == TLS
    assert classify_first_bytes(bytes.fromhex("160303001402")) == PLAINTEXT  # a handshake, not a ClientHello
    assert classify_first_bytes(bytes.fromhex("170303001401")) == PLAINTEXT  # application data
    assert classify_first_bytes(b"GET / HTTP/1.1\r\n") == PLAINTEXT
    assert classify_first_bytes(b"\x16\x03") == PLAINTEXT  # too short to hold a handshake type
    assert classify_first_bytes(b"") == NO_PAYLOAD
    assert looks_like(hello) == "tls client hello"
    assert looks_like(bytes.fromhex("00cef7853c")) == "torch TCPStore"
    assert looks_like(b"GET /health HTTP/1.1") == "http/1"
    assert looks_like(b"PRI * HTTP/2.0\r\n") == "http/2 cleartext"
    assert looks_like(bytes.fromhex("0100000000000000")) == "unrecognized"


def test_capture_on_the_loopback_tells_tls_from_plaintext(
    identity: tls.TlsFiles, servers: tuple[_Server, _Server]
) -> None:
    _root_or_skip()
    secure, plain = servers
    early = socket.create_connection(("127.0.0.1", plain.port), timeout=10)  # open before the capture
    _exchange(early, b"before\n")
    refused_port = socket.create_server(("127.0.0.1", 0))
    closed = int(refused_port.getsockname()[1])
    refused_port.close()
    sniffer = Sniffer("lo").start()
    try:
        client = identity.client_context()
        with client.wrap_socket(
            socket.create_connection(("127.0.0.1", secure.port), timeout=10), server_hostname="server"
        ) as s:
            _exchange(s, b"secret over tls\n")
        with socket.create_connection(("127.0.0.1", plain.port), timeout=10) as s:
            _exchange(s, b"secret in the clear\n")
        _exchange(early, b"after\n")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", closed), timeout=10)
    finally:
        early.close()
        flows = sniffer.stop()
    assert not sniffer.stats.errors and not sniffer.thread_alive
    ours = {secure.port: "tls-server", plain.port: "plain-server", closed: "nobody"}
    mine = [f for f in flows if f.server[1] in ours or f.client[1] in ours]
    by_port: dict[int, list[str]] = {}
    for f in mine:
        by_port.setdefault(f.server[1] if f.server[1] in ours else f.client[1], []).append(f.kind)
    assert by_port[secure.port] == [TLS], by_port
    assert sorted(by_port[plain.port]) == [PLAINTEXT, UNKNOWN_START], by_port  # the early one: mid-stream
    assert by_port[closed] == [NO_PAYLOAD], by_port
    plain_flow = next(f for f in mine if f.server[1] == plain.port and f.kind == PLAINTEXT)
    assert plain_flow.client_first == b"secret in the cle"[:16]
    assert plain_flow.bytes_to_server == len(b"secret in the clear\n") and plain_flow.bytes_to_client == 3

    names = {"127.0.0.1": "local"}
    report = summarize(mine, names, [ipaddress.ip_network("127.0.0.0/8")])
    assert report["flows"] == 4 and report["tls"] == 1 and report["plaintext_flows"] == 1, report
    assert report["unknown_start_flows"] == 1 and not report["all_tls"], report
    assert [(c["port"], c["refused"]) for c in report["no_payload_channels"]] == [(closed, 1)], report
    assert report["plaintext"][0]["refused"] == 0, report
    row = report["plaintext"][0]
    assert (row["client"], row["server"], row["port"]) == ("local", "local", plain.port), row
    assert bytes.fromhex(row["first_bytes_hex"]).startswith(b"secret in the")
    assert row["looks_like"] == "unrecognized" and row["bytes"] == 20 + 3, row
    only_tls = summarize([f for f in mine if f.kind == TLS], names, [ipaddress.ip_network("127.0.0.0/8")])
    assert only_tls["all_tls"] and only_tls["tls_channels"][0]["port"] == secure.port, only_tls
    assert summarize(mine, names, [ipaddress.ip_network("10.0.0.0/8")])["flows"] == 0  # outside: not counted
