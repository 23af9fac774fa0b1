"""Archived trajectory trees: one gzip file per execution, the tree's stored node bytes verbatim.

Trees leave Redis once the step that consumed their group committed (gyre/store/archive.py); they
are kept here so replays and audits of a finished run still see every recorded call:

    path = write_archived_tree(tree_path(archive_dir, eid), eid, meta, blobs)   # blobs: node id → bytes
    tree = load_archived_tree(path)                                             # a read-only TrajectoryTree
    for eid, path in archived_trees(run_dir).items(): ...                       # a run dir or an archive dir

A file holds a magic line, one JSON header line (`execution_id`, `num_nodes`, and `meta`: the
tree store's meta hash — profile, template, policy version, closed flag, counters), then each node
as a little-endian uint32 length and the `encode_node` bytes exactly as Redis held them, in node-id
order; the whole is gzip-compressed. Reading the file back gives the identical tree.

Writes are durable and atomic: a temporary file in the same directory is written, fsynced and
renamed over the final name, then the directory is fsynced. A file that exists is complete and
is never rewritten (a redelivered archive request finds it and moves on), so whoever deletes the
Redis copy after `write_archived_tree` returned cannot lose a tree.
"""

from __future__ import annotations

import gzip
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gyre.durable import write_durable
from gyre.trajectory.codec import encode_node
from gyre.trajectory.profiles import HarnessProfile, get_profile
from gyre.trajectory.templates.base import ChatTemplate
from gyre.trajectory.tree import TrajectoryTree

MAGIC = b"GYRE-TREE-ARCHIVE 1\n"
TREE_SUFFIX = ".tree.gz"
ARCHIVE_DIR = "archive"
"""Name of the archive directory inside a run directory (`runs/<run>/archive`)."""
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class ArchivedTree:
    """The content of one tree archive file."""

    execution_id: str
    meta: dict[str, str]
    """The tree store's meta hash as it was in Redis (profile, template, policy_version, closed, ...)."""
    blobs: list[bytes] = field(default_factory=list)
    """`encode_node` bytes of every node, in node-id order."""

    def tree(
        self, template: ChatTemplate | None = None, profile: HarnessProfile | None = None
    ) -> TrajectoryTree:
        """The tree (read-only without `template`), its profile the stored one unless given."""
        return TrajectoryTree.from_nodes(
            self.execution_id,
            template,
            profile if profile is not None else get_profile(self.meta.get("profile", "generic")),
            self.blobs,
            closed=self.meta.get("closed") == "1",
        )


def tree_path(archive_dir: Path, execution_id: str) -> Path:
    """Where the tree of `execution_id` is archived under `archive_dir`."""
    if not execution_id or "/" in execution_id or execution_id.startswith("."):
        raise ValueError(f"execution id {execution_id!r} cannot name an archive file")
    return Path(archive_dir) / "trees" / f"{execution_id}{TREE_SUFFIX}"


def tree_blobs(tree: TrajectoryTree) -> dict[int, bytes]:
    """Node id → `encode_node` bytes of every node of a tree (what the tree store holds)."""
    return {node_id: encode_node(node) for node_id, node in tree.nodes.items()}


def encode_archived_tree(
    execution_id: str, meta: Mapping[str, str], blobs: Mapping[int, bytes], compress_level: int = 6
) -> bytes:
    """The gzip bytes of a tree archive; `blobs` maps node id → `encode_node` bytes."""
    ordered = sorted(blobs.items())
    header = {"execution_id": execution_id, "num_nodes": len(ordered), "meta": dict(meta)}
    parts = [MAGIC, json.dumps(header, sort_keys=True).encode() + b"\n"]
    for _, blob in ordered:
        parts += [_LENGTH.pack(len(blob)), blob]
    return gzip.compress(b"".join(parts), compresslevel=compress_level, mtime=0)


def write_archived_tree(
    path: Path,
    execution_id: str,
    meta: Mapping[str, str],
    blobs: Mapping[int, bytes],
    compress_level: int = 6,
) -> Path:
    """Archive one tree at `path` (see `tree_path`); a file already there is kept as it is."""
    if not Path(path).exists():
        write_durable(path, encode_archived_tree(execution_id, meta, blobs, compress_level))
    return Path(path)


def read_archived_tree(path: Path) -> ArchivedTree:
    """Parse a tree archive file; a ValueError names the file and what is wrong with it."""
    try:
        raw = gzip.decompress(Path(path).read_bytes())
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: not a gzip tree archive ({e})") from None
    if not raw.startswith(MAGIC):
        raise ValueError(f"{path}: not a Gyre tree archive (bad magic line)")
    end = raw.find(b"\n", len(MAGIC))
    try:
        header = json.loads(raw[len(MAGIC) : end])
        execution_id, num_nodes, meta = header["execution_id"], int(header["num_nodes"]), header["meta"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: bad tree archive header ({e!r})") from None
    blobs: list[bytes] = []
    at = end + 1
    while at < len(raw):
        if at + _LENGTH.size > len(raw):
            raise ValueError(f"{path}: truncated after {len(blobs)} nodes")
        (size,) = _LENGTH.unpack_from(raw, at)
        at += _LENGTH.size
        if at + size > len(raw):
            raise ValueError(f"{path}: truncated after {len(blobs)} nodes")
        blobs.append(raw[at : at + size])
        at += size
    if len(blobs) != num_nodes:
        raise ValueError(f"{path}: header says {num_nodes} nodes, the file holds {len(blobs)}")
    return ArchivedTree(str(execution_id), {str(k): str(v) for k, v in meta.items()}, blobs)


def load_archived_tree(
    path: Path, template: ChatTemplate | None = None, profile: HarnessProfile | None = None
) -> TrajectoryTree:
    """The archived tree at `path` (read-only without `template`; the stored profile unless given)."""
    return read_archived_tree(path).tree(template, profile)


def archive_dir_of(directory: Path) -> Path:
    """The archive directory of `directory`: itself when it holds `trees/`, else `<dir>/archive`."""
    directory = Path(directory)
    if (directory / "trees").is_dir() or not (directory / ARCHIVE_DIR).is_dir():
        return directory
    return directory / ARCHIVE_DIR


def archived_trees(directory: Path) -> dict[str, Path]:
    """Execution id → tree archive file, for a run directory or an archive directory (sorted by id)."""
    trees = archive_dir_of(directory) / "trees"
    if not trees.is_dir():
        return {}
    found = {p.name.removesuffix(TREE_SUFFIX): p for p in trees.iterdir() if p.name.endswith(TREE_SUFFIX)}
    return dict(sorted(found.items()))
