"""gRPC stubs of the services the scheduler drives (cell agents, proxy, packer, runner), and the retry
of a call while its peer is down or restarting (`call_peer`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from gyre import tls
from gyre.config import GyreConfig
from gyre.log import get_logger
from gyre.rpc import aio_channel
from gyre.v1 import cell_agent_pb2_grpc, common_pb2, packer_pb2_grpc, proxy_pb2_grpc, runner_pb2_grpc
from services.scheduler.naming import engine_id

log = get_logger("gyre.scheduler.peers")
T = TypeVar("T")


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
            ch = aio_channel(f"{host}:{port}")
            channels.append(ch)
            return ch

        k = config.scheduler.num_cells
        ports, engine_ports = config.cell_agent.ports, config.cell_agent.engine_ports
        if len(ports) < k or len(engine_ports) < k:
            raise ValueError(
                f"cell_agent.ports and cell_agent.engine_ports must list all {k} cells (gyre up fills them)"
            )
        cells = [
            cell_agent_pb2_grpc.CellAgentStub(channel(run.peer_host("cell_agent", c), ports[c]))
            for c in range(k)
        ]
        # The embedded engine serves HTTPS with the deployment's TLS; SGLang's server stays plaintext.
        embedded = config.cell_agent.engine.backend == "embedded"
        engine_scheme = tls.http_scheme() if embedded else "http"
        engines = [
            common_pb2.EngineEndpoint(
                engine_id=engine_id(c),
                url=f"{engine_scheme}://{run.peer_host('cell_agent', c)}:{engine_ports[c]}",
                cell=c,
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


RETRYABLE: frozenset[grpc.StatusCode] = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)
"""Codes of a peer that is down, restarting or was cut off mid-call: the call is repeated."""


async def call_peer(
    rpc: Callable[..., Awaitable[T]],
    request: Message,
    *,
    timeout_s: float,
    retry_s: float,
    what: str,
    retry_on: frozenset[grpc.StatusCode] = RETRYABLE,
) -> T:
    """`rpc(request)`, repeated with backoff (0.2 s doubling, at most 2 s: a restarted peer is called
    again within 2 s of serving) while it fails with a code in `retry_on`, for at most `retry_s`; then the
    last error is raised. Every call the scheduler retries is
    idempotent on the peer (a repeated SwitchRole, JoinBatch, OpenBatch, PublishWeights or Drain joins
    or repeats the first)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + retry_s
    delay = 0.2
    while True:
        try:
            return await rpc(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            if e.code() not in retry_on or loop.time() + delay > deadline:
                raise
            log.warning(
                "peer_call_retried",
                call=what,
                code=e.code().name,
                detail=(e.details() or "")[:200],
                retry_in_s=delay,
            )
        await asyncio.sleep(delay)
        delay = min(2.0, delay * 2)
