"""The packer service shell: connects to NATS and Redis and serves gRPC with grpc.health.v1."""

from __future__ import annotations

from gyre.service import GyreService


class PackerService(GyreService):
    """packer service: the stream packing buffer that turns ready groups into micro-steps."""

    name = "packer"
