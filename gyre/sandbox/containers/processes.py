"""A container's processes and files as this host sees them, for what the engine's API cannot do
reliably: podman 4.3 never updates a detached exec session's state (it reports it running, exit code 0,
forever), and the API has no way to signal an exec'd process or every process of a container.

    procs = container_pids(init_pid)            # every process of the container (its cgroup)
    signal_all(init_pid, SIGTERM, keep={init_pid, wrapper_pid})
    cpu_s(init_pid), oom_kills(init_pid)        # the container's CPU time and OOM kills
    read_inside(init_pid, "/.gyre/control/status", max_bytes=4096), exists_inside(init_pid, "/tests")
    copy_out(init_pid, "/app", host_dir, budget=CopyBudget(1 << 30, 100_000))  # out to the host, capped

Everything goes through the container's cgroup (`/proc/<init>/cgroup`, cgroup v1 or v2) and its root
(`/proc/<init>/root`), so the runner must run on the engine's host with root. A file is read from inside
the container without following any symlink on the way (the harness owns that filesystem: a symlink
there would otherwise point into the host's).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

from gyre.sandbox.launchers.base import CopyBudget, CopyOutLimit

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_path(init_pid: int, controller: str) -> Path | None:
    """The container's cgroup directory for `controller` (v1), or its unified one (v2)."""
    try:
        lines = Path(f"/proc/{init_pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    unified: Path | None = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            candidate = CGROUP_ROOT / controller / path.lstrip("/")
            if candidate.is_dir():
                return candidate
        if controllers == "":
            unified = CGROUP_ROOT / "unified" / path.lstrip("/")
            if not unified.is_dir():
                unified = CGROUP_ROOT / path.lstrip("/")
    return unified if unified is not None and unified.is_dir() else None


def container_pids(init_pid: int) -> list[int]:
    """Every process of the container (its pids cgroup), the init included; [] when it is gone."""
    path = _cgroup_path(init_pid, "pids")
    if path is None:
        return []
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def signal_all(init_pid: int, sig: int, keep: set[int]) -> int:
    """Send `sig` to every process of the container except those in `keep`; returns how many got it."""
    sent = 0
    for pid in container_pids(init_pid):
        if pid in keep:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            sent += 1
    return sent


def _read_counter(path: Path | None, name: str, key: str | None) -> float:
    if path is None:
        return 0.0
    try:
        text = (path / name).read_text()
    except OSError:
        return 0.0
    if key is None:
        return float(text.split()[0])
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return float(parts[1])
    return 0.0


def cpu_s(init_pid: int) -> float:
    """CPU seconds of every process the container ran so far (its cgroup's accounting)."""
    v1 = _cgroup_path(init_pid, "cpuacct")
    if v1 is not None and (v1 / "cpuacct.usage").exists():
        return _read_counter(v1, "cpuacct.usage", None) / 1e9
    return _read_counter(_cgroup_path(init_pid, "cpu"), "cpu.stat", "usage_usec") / 1e6


def oom_kills(init_pid: int) -> int:
    """Processes of the container the kernel killed for its memory limit."""
    path = _cgroup_path(init_pid, "memory")
    if path is not None and (path / "memory.oom_control").exists():
        return int(_read_counter(path, "memory.oom_control", "oom_kill"))
    return int(_read_counter(path, "memory.events", "oom_kill"))


def _walk_inside(init_pid: int, inside: str) -> tuple[int, str] | None:
    """(an fd of the parent directory of `inside`, its last component), every directory on the way opened
    without following a symlink; None when a component is missing or the container is gone."""
    parts = [p for p in inside.split("/") if p and p != "."]
    if not parts or ".." in parts:
        raise ValueError(f"an absolute path inside the container; got {inside!r}")
    try:
        fd = os.open(f"/proc/{init_pid}/root", os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError:
        os.close(fd)
        return None
    return fd, parts[-1]


def exists_inside(init_pid: int, inside: str) -> bool:
    """Something (anything, a symlink too) is at `inside` in the container."""
    found = _walk_inside(init_pid, inside)
    if found is None:
        return False
    fd, name = found
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def copy_out(
    init_pid: int, inside: str, target: Path, max_depth: int = 128, budget: CopyBudget | None = None
) -> bool:
    """Copy directory `inside` of the container into host directory `target` (created): directories,
    regular files (their permission bits, without setuid, setgid and sticky) and symlinks as links; never
    following a symlink, skipping sockets, fifos and devices and what lies deeper than `max_depth`. False
    when `inside` is missing or not a directory. With a `budget`, every directory, file and symlink
    copied counts one file and every byte of a file's content (a symlink's target) one byte: the copy
    stops before the entry or the chunk that would pass a cap, removes `target` and raises
    `CopyOutLimit`. (The engine's archive API does the same at ~0.1 s of its CPU per call, the most a
    container execution costs it.)"""
    found = _walk_inside(init_pid, inside)
    if found is None:
        return False
    parent, name = found
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except OSError:
        return False
    finally:
        os.close(parent)
    target.mkdir(parents=True, exist_ok=True)
    try:
        _copy_dir(fd, target, max_depth, budget)
    except CopyOutLimit:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return True


def _copy_dir(fd: int, target: Path, depth: int, budget: CopyBudget | None) -> None:
    """Copy what directory `fd` holds into `target`; closes `fd`."""
    try:
        for entry in os.scandir(fd):
            try:
                _copy_entry(fd, entry.name, target / entry.name, depth, budget)
            except OSError:
                continue  # changed or unreadable meanwhile: not copied
    finally:
        os.close(fd)


def _copy_entry(fd: int, name: str, dest: Path, depth: int, budget: CopyBudget | None) -> None:
    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    mode = stat.S_IMODE(info.st_mode) & 0o777
    if stat.S_ISDIR(info.st_mode) and depth > 0:
        if budget is not None:
            budget.add_file()
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        dest.mkdir()
        _copy_dir(sub, dest, depth - 1, budget)
        dest.chmod(mode | 0o700)
    elif stat.S_ISLNK(info.st_mode):
        link = os.readlink(name, dir_fd=fd)
        if budget is not None:
            budget.add_file()
            budget.add_bytes(len(os.fsencode(link)))
        os.symlink(link, dest)
    elif stat.S_ISREG(info.st_mode):
        if budget is not None:
            budget.add_file()
            budget.need_bytes(info.st_size)  # a file past the cap is not begun
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        with os.fdopen(src, "rb") as fsrc, dest.open("xb") as fdst:
            _copy_bytes(fsrc, fdst, budget)
        dest.chmod(mode)


def _copy_bytes(fsrc: BinaryIO, fdst: BinaryIO, budget: CopyBudget | None, chunk: int = 1 << 20) -> None:
    """Copy to the end of `fsrc`, each chunk counted before it is written (a file that grew meanwhile
    stops at the cap)."""
    while True:
        size = chunk if budget is None else min(chunk, budget.max_bytes - budget.bytes + 1)
        data = fsrc.read(size)
        if not data:
            return
        if budget is not None:
            budget.add_bytes(len(data))
        fdst.write(data)


def read_inside(init_pid: int, inside: str, max_bytes: int = 64 << 10) -> bytes | None:
    """The last `max_bytes` of a regular file inside the container, never following a symlink; None
    when it is missing, not a regular file, or the container is gone."""
    found = _walk_inside(init_pid, inside)
    if found is None:
        return None
    fd, name = found
    try:
        leaf = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        info = os.fstat(leaf)
        if not stat.S_ISREG(info.st_mode):
            return None
        os.lseek(leaf, max(0, info.st_size - max_bytes), os.SEEK_SET)
        return os.read(leaf, max_bytes)
    finally:
        os.close(leaf)
