"""`free_port` hands out ports that nothing else can take before the service binds them."""

from __future__ import annotations

import socket

import pytest

from app.stack import servers
from app.stack.servers import LOOPBACK, free_port


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    ephemeral_lo, _ = servers._ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < ephemeral_lo for p in ports)
    for port in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, port))


def test_a_port_in_use_is_never_given_and_none_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    window = range(24000, 25001)  # the whole range free_port may pick from, for this test
    monkeypatch.setattr(servers, "_LOWEST_PORT", window.start)
    monkeypatch.setattr(servers, "_ephemeral_range", lambda: (window.stop, 60999))
    monkeypatch.setattr(servers, "_PORTS_GIVEN", set())
    held: list[socket.socket] = []
    try:
        for port in window[:-10]:  # hold all but the last 10 (the ones someone else holds stay held)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                s.close()
                continue
            held.append(s)
        free = [p for p in window[-10:] if _bindable(p)]
        assert sorted(free_port() for _ in free) == free
        with pytest.raises(OSError, match="no free TCP port"):
            free_port()
    finally:
        for s in held:
            s.close()


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
        return True
