"""Tar archives into containers (the engine's copy API speaks tar; what comes out is copied by the
host's view of the container instead, gyre/sandbox/containers/processes.py `copy_out`).

    data = pack([TreeEntry(workspace, "app"), DirEntry(".gyre/control", mode=0o755)], uid=0, gid=0)
    container.put_archive("/", data)

Names inside an archive are relative to the directory it is put at.
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
