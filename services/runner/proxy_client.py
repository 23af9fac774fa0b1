"""The runner's view of the proxy: per-execution credentials through the Proxy gRPC API only
(OpenExecution / CloseExecution), so the real proxy and the test stub are interchangeable."""

from __future__ import annotations

import asyncio
import time

import grpc

from gyre.log import get_logger
from gyre.rpc import aio_channel
from gyre.v1 import common_pb2, proxy_pb2, proxy_pb2_grpc

log = get_logger("gyre.runner.proxy")


class ProxyUnavailableError(RuntimeError):
    """OpenExecution failed on every attempt."""


class ProxyClient:
    def __init__(
        self, address: str, attempts: int = 3, timeout_s: float = 10.0, retry_s: float = 0.0
    ) -> None:
        self.address = address
        self.attempts = attempts
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self._channel = aio_channel(address)
        self._stub = proxy_pb2_grpc.ProxyStub(self._channel)

    async def open(
        self, execution: common_pb2.ExecutionRef, profile: str, engine_id: str
    ) -> proxy_pb2.OpenExecutionResponse:
        """Credentials for one execution; retries transient failures (`attempts` times, and for `retry_s`
        seconds: a proxy restarting after a crash), then `ProxyUnavailableError`."""
        request = proxy_pb2.OpenExecutionRequest(execution=execution, profile=profile, engine_id=engine_id)
        deadline = time.monotonic() + self.retry_s
        attempt = 0
        while True:
            attempt += 1
            try:
                response: proxy_pb2.OpenExecutionResponse = await self._stub.OpenExecution(
                    request, timeout=self.timeout_s
                )
                return response
            except grpc.aio.AioRpcError as e:
                spent = attempt >= self.attempts and time.monotonic() >= deadline
                if spent or e.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                ):
                    raise ProxyUnavailableError(
                        f"OpenExecution at {self.address}: {e.code().name}: {e.details()}"
                    ) from e
                await asyncio.sleep(min(2.0, 0.5 * attempt))

    async def close_execution(self, execution_id: str) -> None:
        """Freeze the execution's tree; a failure is logged (the termination is reported anyway)."""
        try:
            await self._stub.CloseExecution(
                proxy_pb2.CloseExecutionRequest(execution_id=execution_id), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as e:
            log.warning("proxy_close_failed", execution=execution_id, code=e.code().name, details=e.details())

    async def close(self) -> None:
        await self._channel.close()
