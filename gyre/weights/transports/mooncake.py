"""The `mooncake` weight transport: the Mooncake Transfer Engine (TCP on CPU machines, RDMA on clusters).

The core registers its flat parameter buffer with its transfer engine once (the buffer never moves)
and announces `host:rpc_port` and the buffer's address; a satellite registers its own flat buffer and
reads the core's with `transfer_sync_read`, which the core's engine serves without Python on the core
being involved. Large buffers are read in parallel chunks (`batch_transfer_sync_read`).

Mooncake's P2P handshake and its TCP transport listen on 0.0.0.0 whatever host is given: keep the
nodes on a private network (README, security notes). The CPU build (`mooncake-transfer-engine-non-cuda`)
registers host memory only; GPU buffers need the CUDA build. Needs Debian's `libibverbs1` at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from gyre.weights.transports.base import TransportError, TransportOptions, WeightTransport

CHUNK_BYTES = 64 << 20
"""Reads above this size are split into chunks of this size and issued as one batch."""


def _engine_class() -> Any:
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:
        raise TransportError(
            "cell_agent.trainer.weight_transport is 'mooncake' but the Mooncake Transfer Engine is not "
            "importable: pip install 'gyre[mooncake]' (mooncake-transfer-engine-non-cuda) and apt install "
            f"libibverbs1, or set weight_transport: torch ({e})"
        ) from e
    return TransferEngine


class MooncakeTransport(WeightTransport):
    name: ClassVar[str] = "mooncake"
    core_serves: ClassVar[bool] = False

    def __init__(self, options: TransportOptions) -> None:
        self.options = options
        self._engine: Any = None
        self._registered: dict[int, int] = {}

    @classmethod
    def create(cls, options: TransportOptions) -> MooncakeTransport:
        return cls(options)

    def _te(self) -> Any:
        if self._engine is None:
            engine = _engine_class()()
            rc = engine.initialize(
                self.options.host, "P2PHANDSHAKE", self.options.protocol, self.options.device
            )
            if rc != 0:
                raise TransportError(
                    f"Mooncake initialize({self.options.host!r}, {self.options.protocol!r}) failed: {rc}"
                )
            self._engine = engine
        return self._engine

    def _register(self, buffer: torch.Tensor) -> None:
        if buffer.device.type != "cpu":
            raise TransportError(
                "the non-CUDA Mooncake build registers host memory only; the buffer is on "
                f"{buffer.device} (install the CUDA build, or use weight_transport: torch)"
            )
        if not buffer.is_contiguous():
            raise TransportError("a registered buffer must be contiguous")
        ptr, nbytes = buffer.data_ptr(), buffer.numel() * buffer.element_size()
        if self._registered.get(ptr) == nbytes:
            return
        if ptr in self._registered:
            self._te().unregister_memory(ptr)
        rc = self._te().register_memory(ptr, nbytes)
        if rc != 0:
            raise TransportError(f"Mooncake register_memory of {nbytes} bytes failed: {rc}")
        self._registered[ptr] = nbytes

    def expose(self, buffer: torch.Tensor) -> dict[str, str]:
        self._register(buffer)
        return {
            "session": f"{self.options.host}:{self._te().get_rpc_port()}",
            "address": str(buffer.data_ptr()),
            "nbytes": str(buffer.numel() * buffer.element_size()),
        }

    def pull(self, endpoint: Mapping[str, str], into: torch.Tensor, *, cell: int) -> int | None:
        nbytes = into.numel() * into.element_size()
        if int(endpoint["nbytes"]) != nbytes:
            raise TransportError(
                f"the core's buffer has {endpoint['nbytes']} bytes; this cell's has {nbytes}"
            )
        self._register(into)
        session, remote, local = endpoint["session"], int(endpoint["address"]), into.data_ptr()
        if nbytes <= CHUNK_BYTES:
            rc = self._te().transfer_sync_read(session, local, remote, nbytes)
        else:
            offsets = list(range(0, nbytes, CHUNK_BYTES))
            lengths = [min(CHUNK_BYTES, nbytes - o) for o in offsets]
            rc = self._te().batch_transfer_sync_read(
                session, [local + o for o in offsets], [remote + o for o in offsets], lengths
            )
        if rc != 0:
            raise TransportError(f"Mooncake read of {nbytes} bytes from {session} failed: {rc}")
        return None

    def close(self) -> None:
        if self._engine is not None:
            for ptr in list(self._registered):
                self._engine.unregister_memory(ptr)
            self._registered.clear()
            self._engine = None
