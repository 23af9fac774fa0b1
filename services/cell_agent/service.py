"""The cell_agent service shell: connects to NATS and Redis and serves gRPC with grpc.health.v1."""

from __future__ import annotations

from gyre.service import GyreService


class CellAgentService(GyreService):
    """One cell: its role, its rollout engine, its trainer, weights and gradient collectives."""

    name = "cell_agent"

    @property
    def cell(self) -> int:
        return self.instance or 0

    def configured_port(self) -> int:
        ports = self.config.cell_agent.ports
        return ports[self.cell] if self.cell < len(ports) else 0
