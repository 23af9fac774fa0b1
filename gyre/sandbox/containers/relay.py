"""The proxy relay of one container: the container's only network exit.

    python -I -S relay.py INIT_PID LISTEN_PORT TARGET_HOST TARGET_PORT

A container of the `container` launcher has network mode `none` (only loopback), unless its task allows
the internet. This process (root, on the engine's host) enters the container's network namespace
(`setns` on /proc/INIT_PID/ns/net), creates a socket listening on 127.0.0.1:LISTEN_PORT there, and goes
back to the host's namespace: a socket stays in the namespace it was created in, so connections the
container makes to its own 127.0.0.1:LISTEN_PORT arrive here and are relayed to TARGET_HOST:TARGET_PORT
(the proxy) from the host side. It prints `ready` once it listens, and exits when the container's init
process is gone. Standard library only (it starts in ~20 ms); the relay loop is init.py's.

Run by the runner in a session of its own, so it outlives a runner restart like the container does.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from init import relay

CLONE_NEWNET = 0x40000000


def start_ticks(pid: int) -> int | None:
    """The start time of `pid` in clock ticks (field 22 of /proc/PID/stat); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def listen_inside(init_pid: int, port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:`port` in the network namespace of `init_pid`."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    inside = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY)
    try:
        setns(inside)
        try:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(128)
        finally:
            setns(home)
    finally:
        os.close(home)
        os.close(inside)
    return listener


def main(init_pid: int, port: int, target_host: str, target_port: int) -> int:
    started = start_ticks(init_pid)
    try:
        listener = listen_inside(init_pid, port)
    except OSError as e:
        print(f"error: {e}", flush=True)
        return 1
    relay(listener, lambda: socket.create_connection((target_host, target_port), timeout=30))
    print("ready", flush=True)
    os.close(1)
    while started is not None and start_ticks(init_pid) == started:
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
