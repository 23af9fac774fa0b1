"""Published weights between cells that share no disk: the core streams a publication's files over gRPC
(`CellAgent.FetchPublished`), a satellite writes them into its own directory and loads them from there.

    source = PublishedWeights(mode="core", cell=2, own_root=ckpt, core_address="cell-agent-0:50060", ...)
    path = await source.local(published)        # the directory this cell's engine loads `published` from
    async for chunk in stream_publication(core_root, version): ...      # the core's side

`cell_agent.published_weights` picks the mode: `core` (the default: every cell but the core keeps its copies
under `<checkpoint root>/cells/<k>/published/`, so per-cell volumes and Kubernetes RWO claims work) or
`shared` (every cell reads the core's directory: one volume mounted by all). A copy is assembled under a
temporary name and renamed into place once every file's SHA-256 matched the core's, so a cell never loads
half a publication. Files in subdirectories (a tokenizer's, an adapter's) travel under their path relative
to the publication (`a/b.json`); a name that would leave the directory is refused. The core keeps its
`keep` newest publications; a satellite asking for one already pruned gets NOT_FOUND and asks for the
newest instead (the published record in Redis names it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import BinaryIO, Literal

import grpc

from gyre.log import get_logger
from gyre.trainer.checkpoint import published_path
from gyre.v1 import cell_agent_pb2 as pb
from gyre.v1 import cell_agent_pb2_grpc as pb_grpc
from services.cell_agent.errors import CellUnavailableError
from services.cell_agent.trainer_state import Published

log = get_logger("gyre.cell_agent.published")

CHUNK_BYTES = 1 << 20
"""Bytes per streamed chunk (gRPC's default message limit is 4 MiB)."""
RETRY_S = 0.5
"""Wait between two tries while the core cannot be reached (it restarts, or the network is cut)."""

PublishedMode = Literal["core", "shared"]


class PublicationGone(LookupError):
    """The core has no publication of that version (never written, or pruned): NOT_FOUND."""


async def stream_publication(root: Path, version: int) -> AsyncIterator[pb.PublishedChunk]:
    """Core: the chunks of `published/v<version>/` under `root`, file by file."""
    directory = published_path(root, version)
    if not directory.is_dir():
        raise PublicationGone(f"publication v{version} is not on the core (pruned, or never written)")
    for path in _files_under(directory):
        digest = hashlib.sha256()
        offset = 0
        with open(path, "rb") as f:
            while True:
                data = await asyncio.to_thread(f.read, CHUNK_BYTES)
                digest.update(data)
                last = len(data) < CHUNK_BYTES
                yield pb.PublishedChunk(
                    name=path.relative_to(directory).as_posix(),
                    offset=offset,
                    data=data,
                    last=last,
                    sha256=digest.hexdigest() if last else "",
                )
                offset += len(data)
                if last:
                    break


def _files_under(directory: Path) -> list[Path]:
    """Every file under `directory`, subdirectories included (symlinked directories are not entered)."""
    found: list[Path] = []
    for parent, dirs, files in os.walk(directory):
        dirs.sort()
        found += [Path(parent) / f for f in sorted(files) if (Path(parent) / f).is_file()]
    return found


class PublishedWeights:
    """Where this cell loads a publication from (fetching it from the core first in `core` mode)."""

    def __init__(
        self,
        *,
        mode: PublishedMode,
        cell: int,
        own_root: Path,
        channel: Callable[[], grpc.aio.Channel],
        newest: Callable[[], Awaitable[Published | None]],
        timeout_s: float,
        keep: int = 2,
    ) -> None:
        self.mode = mode
        self.cell = cell
        self.own_root = own_root / "cells" / str(cell)
        """The satellite's copies: `<checkpoint root>/cells/<k>/published/v<version>/`."""
        self._channel = channel
        self._newest = newest
        self.timeout_s = timeout_s
        self.keep = keep
        self.fetched_bytes = 0
        """Bytes received from the core so far (the bench reads it from the log line)."""

    async def local(self, published: Published) -> tuple[Path, int]:
        """(directory, version) of the publication to load: `published` itself, or a newer one when the
        core has pruned it meanwhile."""
        if self.mode == "shared" or self.cell == 0:
            return Path(published.path), published.version
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        target = published
        while True:
            dest = published_path(self.own_root, target.version)
            if dest.is_dir():
                return dest, target.version
            try:
                await self._fetch(target.version, dest)
                self._prune()
                return dest, target.version
            except PublicationGone:
                newest = await self._newest()
                if newest is None or newest.version <= target.version:
                    raise CellUnavailableError(
                        f"publication v{target.version} is gone from the core and no newer one is recorded"
                    ) from None
                target = newest
            except grpc.aio.AioRpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                if loop.time() > deadline:
                    raise CellUnavailableError(
                        f"cell {self.cell}: the core did not serve publication v{target.version} within "
                        f"{self.timeout_s:.0f} s ({e.details()})"
                    ) from None
                log.warning("published_fetch_retry", version=target.version, error=e.details())
                await asyncio.sleep(RETRY_S)

    async def _fetch(self, version: int, dest: Path) -> None:
        staged = dest.with_name(f"{dest.name}.fetching")
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        stub = pb_grpc.CellAgentStub(self._channel())
        received = 0
        with contextlib.ExitStack() as files:
            sink: _File | None = None
            try:
                call = stub.FetchPublished(
                    pb.FetchPublishedRequest(policy_version=version), timeout=self.timeout_s
                )
                async for chunk in call:
                    if sink is None:
                        target = staged / _relative_name(chunk.name)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        sink = _File(files.enter_context(open(target, "wb")), chunk.name)
                    elif chunk.name != sink.name:
                        raise CellUnavailableError(
                            f"publication v{version}: {sink.name} ended without its last chunk"
                        )
                    sink.write(chunk.data)
                    received += len(chunk.data)
                    if chunk.last:
                        sink.finish(chunk.sha256, version)
                        sink = None
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    raise PublicationGone(e.details()) from None
                raise
            if sink is not None or not any(staged.iterdir()):
                raise CellUnavailableError(f"publication v{version}: the stream ended mid-file or empty")
        shutil.rmtree(dest, ignore_errors=True)
        staged.replace(dest)
        self.fetched_bytes += received
        log.info("published_fetched", cell=self.cell, version=version, bytes=received, path=str(dest))

    def _prune(self) -> None:
        parent = published_path(self.own_root, 0).parent
        found = sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.endswith(".fetching"))
        for p in found[: -self.keep]:
            shutil.rmtree(p, ignore_errors=True)


class _File:
    """One file of a publication being received: its bytes and running SHA-256."""

    def __init__(self, out: BinaryIO, name: str) -> None:
        self.out = out
        self.name = name
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.digest.update(data)

    def finish(self, sha256: str, version: int) -> None:
        self.out.close()
        if self.digest.hexdigest() != sha256:
            raise CellUnavailableError(
                f"publication v{version}: {self.name} arrived with SHA-256 {self.digest.hexdigest()[:12]}…, "
                f"the core's is {sha256[:12]}…"
            )


def _relative_name(name: str) -> str:
    """A file's path the core sent (`/`-separated, relative), refused if it would leave the directory."""
    parts = name.split("/")
    if not name or "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts):
        raise CellUnavailableError(f"publication file name {name!r} is not a relative path inside it")
    return name
