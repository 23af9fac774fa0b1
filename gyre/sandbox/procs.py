"""Process bookkeeping for sandboxes: identity that survives pid reuse, and killing every process
of a sandbox uid (the only reliable way to reach processes that left the process group).

A process is identified by (pid, start time: psutil's `create_time` in milliseconds), so a runner
that restarts never signals an unrelated process that reused a pid. psutil does the /proc reading.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal

import psutil


def start_time(pid: int) -> int | None:
    """Start time of `pid` in milliseconds since the epoch; None when no such (live, non-zombie) process."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        created: float = p.create_time()
        return round(created * 1000)
    except psutil.Error:
        return None


def alive(pid: int, started: int) -> bool:
    """The process `pid` that started at `started` still runs (not a zombie, pid not reused)."""
    return start_time(pid) == started


def pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is `uid`."""
    found: list[int] = []
    for p in psutil.process_iter(["uids", "status"]):
        uids, status = p.info["uids"], p.info["status"]
        if uids is not None and uids.real == uid and status != psutil.STATUS_ZOMBIE:
            found.append(p.pid)
    return found


def _kill_binary() -> str:
    found = shutil.which("kill", path="/usr/bin:/bin")
    if found is None:
        raise FileNotFoundError("/bin/kill (procps) is needed to stop sandboxes; apt-get install procps")
    return found


async def signal_uid(uid: int, sig: int) -> None:
    """Send `sig` to every process of `uid` at once: kill(-1) from a process running as `uid`.

    The kernel delivers kill(-1) under the task-list lock, so a fork bomb cannot fork past it.
    The sender is /bin/kill (world-executable, unlike a Python that may live under a closed /root).
    """
    proc = await asyncio.create_subprocess_exec(
        _kill_binary(),
        f"-{int(sig)}",
        "--",
        "-1",
        user=uid,
        group=uid,
        extra_groups=[],
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await proc.wait()


async def kill_uid(uid: int, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process of `uid` until none is left; returns survivors (empty on success)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        left = await asyncio.to_thread(pids_of_uid, uid)
        if not left or loop.time() > deadline:
            return left
        await signal_uid(uid, signal.SIGKILL)
        await asyncio.sleep(0.02)


def signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True
