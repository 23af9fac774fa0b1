"""The cell_agent service shell: NATS + Redis + gRPC (grpc.health.v1), hosting one `CellAgent`.

    python -m services.cell_agent --config runs/<run>/config.yaml --instance <cell>

torch, the engine and the trainer load in `setup()`, after the config is parsed. Joining the other
cells' torch.distributed world runs as a supervised background task (it waits for all K cells), so
the service reports SERVING as soon as its engine serves; JoinBatch waits for the world.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from gyre.config import GyreConfig
from gyre.engine.backends import check_engine
from gyre.model.model_dir import ModelDir
from gyre.service import GyreService
from gyre.trainer.layout import check_trainer
from services.cell_agent.errors import ERROR_STATUSES

if TYPE_CHECKING:
    from services.cell_agent.agent import CellAgent


class CellAgentService(GyreService):
    """One cell: its role, its rollout engine, its trainer, weights and gradient collectives."""

    name = "cell_agent"
    error_statuses = ERROR_STATUSES

    def __init__(self, config: GyreConfig, instance: int | None = None) -> None:
        super().__init__(config, instance)
        # Before any connection: a model directory the engine and trainer cannot load, a trainer layout
        # that cannot build it (megatron), or an engine that cannot start here (no SGLang installed) stops
        # the cell here (exit 2, the field named).
        self.model = ModelDir.open(config.model)  # read once; the agent and its parts get this object
        check_trainer(config.cell_agent.trainer, self.model.path)
        check_engine(config.cell_agent.engine, self.model.path)
        if config.cell_agent.engine.backend == "embedded":
            from services.cell_agent.engine.sources import check_output_source

            check_output_source(config.cell_agent.engine.output_source)

    @property
    def cell(self) -> int:
        return self.instance or 0

    def configured_port(self) -> int:
        ports = self.config.cell_agent.ports
        return ports[self.cell] if self.cell < len(ports) else 0

    async def setup(self) -> None:
        from gyre.v1 import cell_agent_pb2_grpc
        from services.cell_agent.agent import CellAgent
        from services.cell_agent.metrics import CellAgentMetrics
        from services.cell_agent.servicer import CellAgentServicer

        self.agent: CellAgent = CellAgent(
            self.config,
            model=self.model,
            cell=self.cell,
            redis=self.redis,
            emit=self._emit,
            metrics=CellAgentMetrics(self.metrics_registry, self.cell),
        )
        await self.agent.start()
        for i, coro in enumerate(await self.agent.background()):
            self.supervisor.spawn(coro, f"cell-{self.cell}-background-{i}")
        engine = (
            self.agent.engine.supervision()
        )  # runs as long as the engine: a server dead for good ends the agent
        if engine is not None:
            self.supervisor.spawn(engine, f"cell-{self.cell}-engine")
        cell_agent_pb2_grpc.add_CellAgentServicer_to_server(CellAgentServicer(self.agent), self.server)

    async def _emit(self, event: Message, event_id: str) -> None:
        await self.bus.publish(event, event_id=event_id)

    async def stop(self, grace_s: float = 5.0) -> None:
        if hasattr(self, "agent"):  # before the service stops: leaving a step needs its bus and RPCs
            await self.agent.leave_step()
        await super().stop(grace_s)

    async def teardown(self) -> None:
        if hasattr(self, "agent"):
            await self.agent.stop()

    def metrics_registries(self) -> list[CollectorRegistry]:
        """The embedded engine's `gyre_engine_*` series (an SGLang engine serves its own on its port)."""
        engine = self.agent.engine.metrics_registry if hasattr(self, "agent") else None
        return [engine] if engine is not None else []

    def endpoint_info(self) -> dict[str, object]:
        return {"cell": self.cell, "engine_url": self.agent.engine_url} if hasattr(self, "agent") else {}
