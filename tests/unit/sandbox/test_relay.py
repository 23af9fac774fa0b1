"""The sandbox's relay to the proxy (`gyre.sandbox.init.relay`, which the container relay runs too) keeps a
connection open while the proxy says nothing: a model call on a slow engine sends no byte for longer than
the relay's connect timeout (SGLang on CPUs, a first token after 30 s), and the relay must not cut it."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from gyre.sandbox.init import relay, tcp_connect

CONNECT_TIMEOUT_S = 0.2


def test_a_silent_upstream_longer_than_the_connect_timeout_is_relayed(tmp_path: Path) -> None:
    upstream = socket.create_server(("127.0.0.1", 0))
    port = upstream.getsockname()[1]

    def answer_late() -> None:
        conn, _ = upstream.accept()
        with conn:
            assert conn.recv(5) == b"hello"
            time.sleep(5 * CONNECT_TIMEOUT_S)  # scenario: an upstream silent longer than the connect timeout
            conn.sendall(b"late answer")

    threading.Thread(target=answer_late, daemon=True).start()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "proxy.sock"))
    listener.listen(1)
    relay(listener, lambda: tcp_connect("127.0.0.1", port, connect_timeout_s=CONNECT_TIMEOUT_S))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(30)
        client.connect(str(tmp_path / "proxy.sock"))
        client.sendall(b"hello")
        received = b""
        while chunk := client.recv(64):
            received += chunk
    assert received == b"late answer"
    listener.close()
    upstream.close()
