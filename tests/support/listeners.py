"""Polls the listening sockets of a process tree while a run goes on (the embedded default must bind
loopback only, at every moment: tests/e2e/test_elastic_run.py)."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4 loopback address mapped into IPv6 (::ffff:127.x.y.z)."""
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


class ListenerPoll:
    """TCP listeners and bound, unconnected UDP sockets of `root` and its descendants, polled every
    `interval_s` (~15–30 ms of CPU per poll here); remembers every address seen and any off loopback.
    What the tree already had open when the poll was made is not the run's (a test process may hold
    sockets of earlier tests) and is left out."""

    def __init__(self, root: int, interval_s: float) -> None:
        self.root = root
        self.interval_s = interval_s
        self.polls: list[float] = []
        self.seen: set[str] = set()
        self.bad: list[str] = []
        self.stop = threading.Event()
        self.before = set(self._listening())

    def _listening(self) -> list[tuple[int, str, str]]:
        """(pid, ip, port) of every listening socket of the tree now."""
        try:
            tree = {self.root, *(p.pid for p in psutil.Process(self.root).children(recursive=True))}
        except psutil.Error:
            return []
        found = []
        for c in psutil.net_connections(kind="inet"):
            if c.pid not in tree or not c.laddr:
                continue
            if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr):
                found.append((c.pid, c.laddr.ip, str(c.laddr.port)))
        return found

    def run(self) -> None:
        while not self.stop.is_set():
            for pid, ip, port in self._listening():
                if (pid, ip, port) in self.before:
                    continue
                self.seen.add(f"{ip}:{port}")
                if not is_loopback(ip):
                    self.bad.append(f"pid {pid} {ip}:{port}")
            self.polls.append(time.time())
            self.stop.wait(self.interval_s)


@contextmanager
def polling_listeners(root: int, interval_s: float = 0.5) -> Iterator[ListenerPoll]:
    """A `ListenerPoll` of `root`'s tree running in a thread for the body of the `with`."""
    poll = ListenerPoll(root, interval_s)
    poller = threading.Thread(target=poll.run, daemon=True)
    poller.start()
    try:
        yield poll
    finally:
        poll.stop.set()
        poller.join(5)
