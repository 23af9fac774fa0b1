"""Process bookkeeping through psutil, for the local stack and for sandboxes: identity, dying with the
parent, bounded stops, and killing every process of a sandbox uid.

- A process is identified by (pid, start time: psutil's `create_time`, seconds since the epoch — the one
  time unit here), so a stale `stack.json` or a restarted runner never signals an unrelated process that
  reused a pid.
- `die_with_parent()` is a `preexec_fn`: the child gets SIGTERM from the kernel (PR_SET_PDEATHSIG) when
  the thread that spawned it ends — the supervisor's main thread, i.e. the supervisor process — so a
  SIGKILLed supervisor (or demo) leaves no service behind. Services then stop within their own cap
  (`run.supervisor.service_stop_timeout_s`, gyre/service.py).
- `become_subreaper()` makes orphaned descendants (a sandbox whose runner died) children of the
  supervisor (PR_SET_CHILD_SUBREAPER), so its last sweep finds and stops them.
- `stop_processes()` stops many processes at once: SIGTERM to all, one shared grace period, then SIGKILL
  of what is left together with its descendants.
- `kill_uid()` / `signal_uid()` reach every process of a sandbox uid, also those that left the sandbox's
  process group (the only reliable way to stop them all).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int


@dataclass(frozen=True, slots=True)
class ProcessId:
    """A process: its pid and its start time (psutil `create_time`, seconds since the epoch)."""

    pid: int
    started: float

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        """The live process `pid`, or None."""
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except psutil.Error:
            return None


def start_time(pid: int) -> float | None:
    """Start time of `pid` (seconds since the epoch); None when no such live, non-zombie process."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        created: float = p.create_time()
        return created
    except psutil.Error:
        return None


def alive(pid: int, started: float = 0.0) -> bool:
    """`pid` runs and is no zombie; with `started` (non-zero), it is also the same process (no pid reuse)."""
    try:
        p = psutil.Process(pid)
        if started and abs(p.create_time() - started) > 0.01:
            return False
        return bool(p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` giving the child `sig` when this process's spawning thread exits (PR_SET_PDEATHSIG).

    Spawn from a thread that lives as long as the process (the main thread). A parent that died between
    fork and prctl is caught by comparing the parent pid; the child then signals itself."""
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        if _prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return set_parent_death_signal


def become_subreaper() -> None:
    """Orphaned descendants of this process become its children (and so stay within reach of its stop)."""
    if _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def describe_exit(returncode: int) -> tuple[int, str, str]:
    """(exit code or -1, signal name or "", one line) for a `Popen.returncode`."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return -1, name, f"killed by {name}"
    return returncode, "", f"exited with status {returncode}"


def _processes(ids: Iterable[ProcessId]) -> list[psutil.Process]:
    found = []
    for i in ids:
        try:
            p = psutil.Process(i.pid)
            if not i.started or abs(p.create_time() - i.started) <= 0.01:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _descendants(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    found: list[psutil.Process] = []
    for p in procs:
        try:
            found += p.children(recursive=True)
        except psutil.Error:
            continue
    return found


def _identity(p: psutil.Process) -> ProcessId | None:
    try:
        return ProcessId(p.pid, p.create_time())
    except psutil.Error:
        return None


def _signal(procs: Iterable[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            continue


@dataclass(frozen=True, slots=True)
class StopReport:
    """What one `stop_processes` call did."""

    num_stopped: int
    """Processes of the set that ended after SIGTERM, within the grace period."""
    killed: list[int]
    """Pids SIGKILLed: survivors of the grace period and descendants still running then."""
    left: list[int]
    """Pids still running after the SIGKILL (should be empty)."""


def _running(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def stop_processes(ids: Iterable[ProcessId], grace_s: float, kill_wait_s: float = 1.0) -> StopReport:
    """SIGTERM every process of `ids` at once; after `grace_s`, SIGKILL the survivors and every descendant
    of the set (seen at either moment). Reaps what are children of this process."""
    targets = _processes(ids)
    if not targets:
        return StopReport(0, [], [])
    descendants = _descendants(targets)
    _signal(targets, signal.SIGTERM)
    gone, left = psutil.wait_procs(targets, timeout=grace_s)
    rest = [p for p in {*descendants, *_descendants(left)} if _running(p)]
    doomed = [*left, *rest]
    _signal(doomed, signal.SIGKILL)
    _, still = psutil.wait_procs(doomed, timeout=kill_wait_s)
    return StopReport(len(gone), [p.pid for p in doomed], [p.pid for p in still if _running(p)])


def crash_tree(pid: int) -> list[ProcessId]:
    """SIGKILL process `pid` and every descendant at the same moment, as a machine crash would: all are
    stopped first so that nothing restarts or reacts while the rest die, then all are killed. A process
    that ends on its own meanwhile (a sandbox's short command, a zombie its parent reaps) is dead already,
    which is what is asked, so it is not an error. The processes killed."""
    root = psutil.Process(pid)
    procs: list[psutil.Process] = []
    new = [root]
    while new:  # until the tree is stopped whole: a process may fork between a listing and its stop
        _signal(new, signal.SIGSTOP)
        _wait_stopped(new)  # a signalled process stops on its way back to user space, maybe after a fork
        procs += new
        new = [p for p in _descendants([root]) if p not in procs]
    found = [i for i in map(_identity, procs) if i is not None]
    _signal(procs, signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)
    return found


def _wait_stopped(procs: list[psutil.Process], timeout_s: float = 2.0) -> None:
    """Until every process of `procs` is stopped or gone (bounded: one in uninterruptible sleep stops
    only when it leaves it)."""
    deadline = time.monotonic() + timeout_s
    while not all(map(_halted, procs)) and time.monotonic() < deadline:
        time.sleep(0.001)


def _halted(p: psutil.Process) -> bool:
    try:
        return p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return True


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
