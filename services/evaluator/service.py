"""The evaluator service shell: connects to NATS and Redis and serves gRPC with grpc.health.v1."""

from __future__ import annotations

from gyre.service import GyreService


class EvaluatorService(GyreService):
    """evaluator service: scores preserved workspaces after every termination and marks groups ready."""

    name = "evaluator"
