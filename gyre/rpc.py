"""gRPC as every Gyre process uses it: servers, domain errors mapped to status codes, health, channels.

    server = new_server(error_statuses)            # grpc.aio server with the domain-error interceptor
    health = add_health(server)                    # grpc.health.v1 (the public aio servicer)
    port = bind(server, f"{host}:{port}")          # the one place a server port is bound
    channel = aio_channel("127.0.0.1:7001")        # the one place a client channel is made
    with sync_channel("127.0.0.1:7001") as ch: ... # the same for blocking callers (CLI, health probes)
    call_while_restarting(lambda: stub.GetState(req, timeout=30), timeout_s=60, wait=pause)

A servicer method only translates: it raises the service's domain errors, and `DomainErrorInterceptor`
turns each into the status code of the first `ErrorStatus` whose error types it is an instance of
(`ValueError` → INVALID_ARGUMENT unless a service says otherwise). An error no entry names is a bug and
reaches the client as UNKNOWN, logged by grpc. Transport security lives in `bind` and the two channel
functions and nowhere else: with a TLS identity configured (`gyre.tls.configure`), servers require a
client certificate the deployment's CA signed and channels show this process's and check the server's;
which of those clients may call which method is `gyre.authz`'s table, checked by the interceptor
`new_server` adds with TLS on.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from gyre import tls
from gyre.authz import AuthorizationInterceptor
from gyre.log import get_logger

log = get_logger("gyre.rpc")

T = TypeVar("T")

RESTARTING = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
"""What a call to a service that is restarting (or not up yet) fails with."""


@dataclass(frozen=True, slots=True)
class ErrorStatus:
    """Domain errors of these types answer with `code`; `detail` writes the message."""

    errors: type[BaseException] | tuple[type[BaseException], ...]
    code: grpc.StatusCode
    detail: Callable[[BaseException], str] = str
    log_event: str | None = None
    """Log the error under this event name as well (errors that mean corruption, not a bad request)."""


INVALID_ARGUMENT = ErrorStatus(ValueError, grpc.StatusCode.INVALID_ARGUMENT)
"""The default: a request the service cannot accept."""


class DomainErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps the domain errors a unary handler raises to status codes (the first matching entry wins)."""

    def __init__(self, statuses: Sequence[ErrorStatus]) -> None:
        self.statuses = tuple(statuses)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                return await inner(request, context)
            except Exception as e:
                status = self.status_of(e)
                if status is None:
                    raise
                if status.log_event is not None:
                    log.error(status.log_event, error=str(e))
                await context.abort(status.code, status.detail(e))

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def status_of(self, error: BaseException) -> ErrorStatus | None:
        return next((s for s in self.statuses if isinstance(error, s.errors)), None)


_authorizing: weakref.WeakSet[grpc.aio.Server] = weakref.WeakSet()
"""Servers built with the authorization interceptor: `bind` serves TLS only on one of them."""


def new_server(statuses: Sequence[ErrorStatus] = (INVALID_ARGUMENT,)) -> grpc.aio.Server:
    """A grpc.aio server whose unary handlers answer domain errors with `statuses`' codes. With a TLS
    identity configured, every call is first checked against the caller's identity (`gyre.authz`:
    PERMISSION_DENIED unless the table allows it the method); in plaintext (the embedded default on
    127.0.0.1) there is no identity to check and none is."""
    interceptors: list[grpc.aio.ServerInterceptor] = [DomainErrorInterceptor(statuses)]
    if tls.current() is None:
        return grpc.aio.server(interceptors=interceptors)
    server = grpc.aio.server(interceptors=[AuthorizationInterceptor(), *interceptors])
    _authorizing.add(server)
    return server


def add_health(server: grpc.aio.Server) -> health.aio.HealthServicer:
    """grpc.health.v1 on `server`; the caller sets the overall status (`health.OVERALL_HEALTH`)."""
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


def bind(server: grpc.aio.Server, address: str) -> int:
    """Listen on `address` (`host:port`, port 0 picks one); returns the port. TLS when configured."""
    files = tls.current()
    if files is None:
        return server.add_insecure_port(address)
    if server not in _authorizing:
        raise RuntimeError(
            "rpc: a TLS port on a server built before the TLS identity was configured (gyre.tls.configure "
            "before gyre.rpc.new_server), which would check no caller's identity (gyre.authz)"
        )
    cert, key, ca = files.read()
    credentials = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)
    return server.add_secure_port(address, credentials)


def _channel_credentials() -> grpc.ChannelCredentials | None:
    files = tls.current()
    if files is None:
        return None
    cert, key, ca = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
"""A peer that restarts (the stack's supervisor, a pod) is reached again within a second of serving. With
gRPC's default reconnect backoff (1 s growing 1.6x to 120 s) a channel that failed to connect through an
outage keeps failing every call with the outage's error until its next attempt: after a cell agent's 30 s
restart the scheduler's calls kept failing 10 s after the cell served again (tests/faults), and a 20 s
outage left a channel unusable 5.5 s past the peer's return (under a second with these options).
`grpc.min_reconnect_backoff_ms` stays unset: gRPC takes it as the minimum time one connection attempt may
take (20 s by default), and a short one fails connections to a busy peer."""


def aio_channel(target: str) -> grpc.aio.Channel:
    """A client channel for asyncio callers (services, the stack's supervisor). TLS when configured."""
    credentials = _channel_credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(target, credentials, options=CHANNEL_OPTIONS)


def sync_channel(target: str) -> grpc.Channel:
    """A blocking client channel (the CLI, health probes outside an event loop). TLS when configured."""
    credentials = _channel_credentials()
    if credentials is None:
        return grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    return grpc.secure_channel(target, credentials, options=CHANNEL_OPTIONS)


def call_while_restarting(call: Callable[[], T], timeout_s: float, wait: Callable[[], None]) -> T:
    """`call()` (a blocking stub call), asked again after `wait()` while it fails as a call to a restarting
    service does (`RESTARTING`), for up to `timeout_s`; any other error, or one past that, is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except grpc.RpcError as e:
            if e.code() not in RESTARTING or time.monotonic() > deadline:  # type: ignore[attr-defined]
                raise
        wait()
