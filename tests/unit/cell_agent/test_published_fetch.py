"""A satellite's copy of a publication fetched from the core over gRPC (`CellAgent.FetchPublished`) is the
core's directory file for file, subdirectories included (a tokenizer's or an adapter's files below the
publication), and a name that would leave the directory is refused.

The core's side is `stream_publication` behind a real grpc.aio server; the satellite's is
`PublishedWeights` on a channel to it, as a cell agent runs them.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gyre.rpc import aio_channel, bind, new_server
from gyre.trainer.checkpoint import published_path
from gyre.v1 import cell_agent_pb2 as pb
from gyre.v1 import cell_agent_pb2_grpc as pb_grpc
from services.cell_agent.errors import CellUnavailableError
from services.cell_agent.published_weights import PublishedWeights, stream_publication
from services.cell_agent.trainer_state import Published


class _Core(pb_grpc.CellAgentServicer):
    def __init__(self, root: Path, extra: list[pb.PublishedChunk] | None = None) -> None:
        self.root = root
        self.extra = extra or []

    async def FetchPublished(
        self, request: pb.FetchPublishedRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PublishedChunk]:
        for chunk in self.extra:
            yield chunk
        async for chunk in stream_publication(self.root, int(request.policy_version)):
            yield chunk


def _tree(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


async def _fetch(tmp_path: Path, core: _Core, version: int) -> Path:
    server = new_server()
    pb_grpc.add_CellAgentServicer_to_server(core, server)
    port = bind(server, "127.0.0.1:0")
    await server.start()
    channel = aio_channel(f"127.0.0.1:{port}")
    try:
        weights = PublishedWeights(
            mode="core",
            cell=1,
            own_root=tmp_path / "satellite",
            channel=lambda: channel,
            newest=lambda: _none(),
            timeout_s=10.0,
        )
        path, got = await weights.local(Published(version, str(published_path(core.root, version))))
        assert got == version
        return path
    finally:
        await channel.close()
        await server.stop(None)


async def _none() -> Published | None:
    return None


async def test_a_publication_with_subdirectories_arrives_whole(tmp_path: Path) -> None:
    core_root = tmp_path / "core"
    publication = published_path(core_root, 3)
    (publication / "adapter" / "nested").mkdir(parents=True)
    (publication / "config.json").write_text('{"a": 1}')
    (publication / "model.safetensors").write_bytes(bytes(range(256)) * 9000)  # > 2 chunks of 1 MiB
    (publication / "adapter" / "adapter_config.json").write_text('{"r": 16}')
    (publication / "adapter" / "nested" / "adapter_model.safetensors").write_bytes(b"\x01" * 1000)
    path = await _fetch(tmp_path, _Core(core_root), 3)
    assert path == published_path(tmp_path / "satellite" / "cells" / "1", 3)
    assert _tree(path) == _tree(publication)
    assert len(_tree(path)) == 4


@pytest.mark.parametrize("name", ["../escape.json", "/etc/passwd", "a/../../b", "a//b", ""])
async def test_a_name_leaving_the_directory_is_refused(tmp_path: Path, name: str) -> None:
    core_root = tmp_path / "core"
    publication = published_path(core_root, 1)
    publication.mkdir(parents=True)
    (publication / "config.json").write_text("{}")
    bad = pb.PublishedChunk(
        name=name, offset=0, data=b"x", last=True, sha256=hashlib.sha256(b"x").hexdigest()
    )
    with pytest.raises(CellUnavailableError, match="not a relative path inside it"):
        await _fetch(tmp_path, _Core(core_root, [bad]), 1)
    assert not (tmp_path / "escape.json").exists()
    assert not published_path(tmp_path / "satellite" / "cells" / "1", 1).exists()
