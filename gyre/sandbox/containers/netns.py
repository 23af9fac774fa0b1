"""A listening socket inside another process's network namespace (a container's), made from this one.

    listener = listen_inside(init_pid, 8123)    # 127.0.0.1:8123 as the container sees it

`setns` moves only the calling thread, so this enters the namespace on a thread made for the purpose and
returns to the host's before that thread ends; the socket stays in the namespace it was created in.
Python 3.11 has no os.setns: it is libc's, through ctypes. Needs CAP_SYS_ADMIN (root).
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _listen(pid: int, port: int) -> socket.socket:
    home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    inside = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        _setns(inside)
        try:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(128)
        finally:
            _setns(home)
    finally:
        os.close(home)
        os.close(inside)
    return listener


def listen_inside(pid: int, port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:`port` in the network namespace of process `pid`."""
    result: list[socket.socket] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(_listen(pid, port))
        except BaseException as e:
            error.append(e)

    thread = threading.Thread(target=target, name="netns")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
