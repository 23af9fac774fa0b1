"""Workspaces: created from a task's workspace sources and files, owned by the sandbox while the harness runs,
preserved afterwards and identified by a content hash.

The content hash (sha256 hex) covers every regular file and symlink under the workspace, in
sorted relative-path order: for each, its path, its kind and its content (a symlink's target, not
what it points to). Directories and file modes are not part of it. An evaluation is bound to
(execution, content hash), so the hash must be computed after the last writer stopped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from gyre.tasks import Task, check_relative

_CHUNK = 1 << 20


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """chown -R without following symlinks."""
    os.lchown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


def create_workspace(task: Task, path: Path, sources: bool = True) -> Path:
    """A fresh workspace at `path`: the task's workspace sources in order (a directory's contents merged
    into its target; skipped without `sources`, when the task's image holds them), then its files (the
    launcher hands the workspace to the sandbox)."""
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir()
    for src in task.workspace if sources else ():
        target = path / check_relative(src.target) if src.target else path
        if src.source.is_dir():
            shutil.copytree(src.source, target, symlinks=True, dirs_exist_ok=True)
        else:
            if target.is_dir():  # as COPY does: a file copied onto an existing directory goes into it
                target = target / src.source.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src.source, target, follow_symlinks=False)
    for rel, content in task.files.items():
        target = path / check_relative(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    os.chmod(path, 0o755)
    return path


def preserve(path: Path) -> None:
    """Hand a finished workspace back to root so no later sandbox (same uid) can change it. A runner that
    is not root (a container's non-root user: its sandboxes run under its own uid) cannot: the tree is made
    read-only instead, which keeps nothing out that runs as that uid."""
    if not path.exists():
        return
    if os.geteuid() == 0:
        chown_tree(path, 0, 0)
        return
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                os.chmod(full, os.stat(full).st_mode & ~0o222)


def content_hash(path: Path) -> str:
    """sha256 hex over sorted relative paths, kinds and contents of files and symlinks."""
    entries: list[tuple[str, Path]] = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in dirs + files:
            full = Path(root, name)
            if name in files or full.is_symlink():
                entries.append((full.relative_to(path).as_posix(), full))
    digest = hashlib.sha256()
    for rel, full in sorted(entries):
        digest.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        if full.is_symlink():
            digest.update(b"L" + os.readlink(full).encode("utf-8", "surrogateescape") + b"\0")
        elif full.is_file():
            file_digest = hashlib.sha256()
            with full.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    file_digest.update(chunk)
            digest.update(b"F" + file_digest.digest())
        else:
            digest.update(b"S")  # socket, fifo, device: present but not readable content
    return digest.hexdigest()


def copy_workspace(source: Path, target: Path) -> None:
    """A copy of a preserved workspace for one verifier attempt (the original stays untouched)."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, symlinks=True)
