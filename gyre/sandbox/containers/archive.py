"""Tar archives in and out of containers (the engine's copy API speaks tar).

    data = pack([TreeEntry(workspace, "app"), DirEntry(".gyre/control", mode=0o755)], uid=0, gid=0)
    container.put_archive("/", data)
    stream, _ = container.get_archive("/app")
    unpack(stream, host_dir)               # the contents of /app, into host_dir

Names inside an archive are relative to the directory it is put at. Unpacking uses tarfile's `tar`
filter (no absolute names, nothing outside the target, no device files, no setuid bits): what comes out
of a container was written by the harness, which is not trusted.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """Host directory `source` at `name`: the directory itself (owned by the archive's uid:gid, so the
    command's user can write its workspace) and its contents. Missing parents are created by the engine."""

    source: Path
    name: str


@dataclass(frozen=True, slots=True)
class DirEntry:
    name: str
    mode: int = 0o755


@dataclass(frozen=True, slots=True)
class FileEntry:
    name: str
    content: bytes
    mode: int = 0o644


Entry = TreeEntry | DirEntry | FileEntry


def pack(entries: Iterable[Entry], uid: int, gid: int) -> bytes:
    """An uncompressed tar of `entries`, every member owned by uid:gid (parents created as directories)."""
    buf = io.BytesIO()
    made: set[str] = set()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def directory(name: str, mode: int = 0o755) -> None:
            parts = [p for p in name.split("/") if p]
            for i in range(1, len(parts) + 1):
                sub = "/".join(parts[:i])
                if sub not in made:
                    made.add(sub)
                    info = tarfile.TarInfo(sub)
                    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, gid
                    info.mtime = now
                    tar.addfile(info)

        for entry in entries:
            if isinstance(entry, DirEntry):
                directory(entry.name, entry.mode)
            elif isinstance(entry, FileEntry):
                directory(os.path.dirname(entry.name))
                info = tarfile.TarInfo(entry.name)
                info.size, info.mode, info.uid, info.gid = len(entry.content), entry.mode, uid, gid
                info.mtime = now
                tar.addfile(info, io.BytesIO(entry.content))
            else:
                info = tar.gettarinfo(str(entry.source), arcname=entry.name.strip("/"))
                info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
                tar.addfile(info)
                for path in _walk(entry.source):
                    rel = path.relative_to(entry.source).as_posix()
                    info = tar.gettarinfo(str(path), arcname=f"{entry.name.strip('/')}/{rel}")
                    info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
                    if info.isreg():
                        with path.open("rb") as f:
                            tar.addfile(info, f)
                    elif info.isdir() or info.issym():
                        tar.addfile(info)
    return buf.getvalue()


def _walk(root: Path) -> Iterator[Path]:
    """Every directory, regular file and symlink under `root`, parents first (symlinks not followed)."""
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(dirpath, name)
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                yield path


class _Stream(io.RawIOBase):
    """A file over the engine's chunk iterator, so tarfile reads the archive as it arrives."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._rest))
        buffer[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


def unpack(chunks: Iterable[bytes], target: Path) -> None:
    """Extract an archive of one directory (the engine names its members `<dir>/...`) so that the
    directory's contents land in `target`."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BufferedReader(_Stream(chunks)), mode="r|") as tar:
        for member in tar:
            _, sep, rest = member.name.partition("/")
            if not sep or not rest:
                continue  # the directory itself
            member.name = rest
            if member.islnk():
                _, _, link_rest = member.linkname.partition("/")
                member.linkname = link_rest
            tar.extract(member, target, filter="tar")
