"""A minimal Proxy gRPC servicer for runner tests: OpenExecution / CloseExecution only.

Hands every execution the base URL of a scripted Anthropic endpoint (tests/support/
scripted_anthropic.py) and a per-execution key, and records what was opened and closed. The
runner talks to it through the real Proxy stub, so the real proxy drops in unchanged.

    async with ProxyStub(api.base_url) as proxy:
        config.proxy.port = proxy.port
"""

from __future__ import annotations

import asyncio

import grpc

from gyre.rpc import bind, new_server
from gyre.v1 import proxy_pb2, proxy_pb2_grpc


class ProxyStub(proxy_pb2_grpc.ProxyServicer):
    def __init__(self, base_url: str, fail_opens: int = 0, hold_groups: frozenset[str] = frozenset()) -> None:
        self.base_url = base_url
        self.fail_opens = fail_opens
        """Answer this many OpenExecution calls with UNAVAILABLE first (retry tests)."""
        self.hold_groups = hold_groups
        """OpenExecution of these groups' executions answers only once `released` is set (a start held
        part-way, after its claim)."""
        self.held: list[str] = []
        self.released = asyncio.Event()
        self.opened: dict[str, proxy_pb2.OpenExecutionRequest] = {}
        self.closed: list[str] = []
        self.server = new_server()
        proxy_pb2_grpc.add_ProxyServicer_to_server(self, self.server)
        self.port = bind(self.server, "127.0.0.1:0")

    async def __aenter__(self) -> ProxyStub:
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)

    @staticmethod
    def key_for(execution_id: str) -> str:
        return f"key-{execution_id}"

    async def OpenExecution(
        self, request: proxy_pb2.OpenExecutionRequest, context: grpc.aio.ServicerContext
    ) -> proxy_pb2.OpenExecutionResponse:
        if self.fail_opens > 0:
            self.fail_opens -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "proxy stub: scripted unavailability")
        eid = request.execution.execution_id
        if request.execution.group_id in self.hold_groups:
            self.held.append(eid)
            await self.released.wait()
        self.opened[eid] = request
        return proxy_pb2.OpenExecutionResponse(base_url=self.base_url, api_key=self.key_for(eid))

    async def CloseExecution(
        self, request: proxy_pb2.CloseExecutionRequest, context: grpc.aio.ServicerContext
    ) -> proxy_pb2.CloseExecutionResponse:
        self.closed.append(request.execution_id)
        return proxy_pb2.CloseExecutionResponse()
