"""Process bookkeeping for sandboxes: identity that survives pid reuse, and killing every process
of a sandbox uid (the only reliable way to reach processes that left the process group).

A process is identified by (pid, start time in clock ticks since boot, from /proc/<pid>/stat), so
a runner that restarts never signals an unrelated process that reused a pid.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

_PROC = Path("/proc")


def start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot; None when no such (live) process."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(") ", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def alive(pid: int, started: int) -> bool:
    """The process `pid` that started at `started` still runs (not a zombie, pid not reused)."""
    return start_time(pid) == started


def pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is `uid`."""
    found: list[int] = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            found.append(int(entry.name))
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
        _kill_binary(), f"-{int(sig)}", "--", "-1",
        user=uid, group=uid, extra_groups=[], stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
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
