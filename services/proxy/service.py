"""The proxy service shell: connects to NATS and Redis and serves gRPC with grpc.health.v1."""

from __future__ import annotations

from gyre.service import GyreService


class ProxyService(GyreService):
    """proxy service: harness-facing HTTP APIs (Anthropic, OpenAI), per-execution credentials, TITO"""

    name = "proxy"
