"""The scheduler service shell: connects to NATS and Redis and serves gRPC with grpc.health.v1."""

from __future__ import annotations

from gyre.service import GyreService


class SchedulerService(GyreService):
    """scheduler service: owns the run (dispatch, start decisions, the capacity ledger, waterlevel,"""

    name = "scheduler"
