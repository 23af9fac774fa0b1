"""gRPC stubs of the services the scheduler drives: cell agents, proxy, packer, runner."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from gyre.config import GyreConfig
from gyre.v1 import cell_agent_pb2_grpc, common_pb2, packer_pb2_grpc, proxy_pb2_grpc, runner_pb2_grpc
from services.scheduler.naming import engine_id


@dataclass
class Peers:
    channels: list[grpc.aio.Channel]
    cells: list[cell_agent_pb2_grpc.CellAgentStub]
    proxy: proxy_pb2_grpc.ProxyStub
    packer: packer_pb2_grpc.PackerStub
    runner: runner_pb2_grpc.RunnerStub
    engines: list[common_pb2.EngineEndpoint]
    """The rollout engine of every cell, index = cell."""

    @classmethod
    def connect(cls, config: GyreConfig) -> Peers:
        run = config.run
        channels: list[grpc.aio.Channel] = []

        def channel(host: str, port: int) -> grpc.aio.Channel:
            ch = grpc.aio.insecure_channel(f"{host}:{port}")
            channels.append(ch)
            return ch

        k = config.scheduler.num_cells
        ports, engine_ports = config.cell_agent.ports, config.cell_agent.engine_ports
        if len(ports) < k or len(engine_ports) < k:
            raise ValueError(
                f"cell_agent.ports and cell_agent.engine_ports must list all {k} cells (gyre up fills them)"
            )
        cells = [
            cell_agent_pb2_grpc.CellAgentStub(channel(run.peer_host("cell_agent", c), ports[c])) for c in range(k)
        ]
        engines = [
            common_pb2.EngineEndpoint(
                engine_id=engine_id(c), url=f"http://{run.peer_host('cell_agent', c)}:{engine_ports[c]}", cell=c
            )
            for c in range(k)
        ]
        return cls(
            channels=channels,
            cells=cells,
            proxy=proxy_pb2_grpc.ProxyStub(channel(run.peer_host("proxy"), config.proxy.port)),
            packer=packer_pb2_grpc.PackerStub(channel(run.peer_host("packer"), config.packer.port)),
            runner=runner_pb2_grpc.RunnerStub(channel(run.peer_host("runner"), config.runner.port)),
            engines=engines,
        )

    async def close(self) -> None:
        for ch in self.channels:
            await ch.close()
