"""The proxy relay of one container: the container's only network exit.

    listener = listen_inside(init_pid, port)       # in the runner (gyre/sandbox/containers/netns.py)
    python -I -S relay.py INIT_PID LISTENER_FD TARGET_HOST TARGET_PORT   # given the listener (pass_fds)

A container of the `container` launcher has network mode `none` (only loopback), unless its task allows
the internet. `listen_inside` (root, on the engine's host) makes a socket listening on 127.0.0.1:PORT
inside the container's network namespace, so connections the container makes to its own 127.0.0.1:PORT
arrive on it. This script, started by the runner in a session of its own with that socket, relays each
connection to TARGET_HOST:TARGET_PORT (the proxy) from the host side, and exits when the container's
init process is gone: it outlives a runner restart like the container does. The harness can connect as
soon as the socket listens (connections wait in its backlog while this process starts). Standard library
only; the relay loop is init.py's.
"""

from __future__ import annotations

import os
import socket
import sys
import time


def start_ticks(pid: int) -> int | None:
    """The start time of `pid` in clock ticks (field 22 of /proc/PID/stat); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def main(init_pid: int, listener_fd: int, target_host: str, target_port: int) -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from init import relay, tcp_connect  # gyre/sandbox/init.py, a standard-library script too

    started = start_ticks(init_pid)
    listener = socket.socket(fileno=listener_fd)
    relay(listener, lambda: tcp_connect(target_host, target_port))
    while started is not None and start_ticks(init_pid) == started:
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
