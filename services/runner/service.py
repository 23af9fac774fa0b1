"""The runner service shell: connects to NATS and Redis and serves gRPC with grpc.health.v1."""

from __future__ import annotations

from gyre.service import GyreService


class RunnerService(GyreService):
    """runner service: harness executions in sandboxes, started from the JetStream work queue."""

    name = "runner"
