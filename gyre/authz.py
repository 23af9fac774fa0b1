"""Who may call which gRPC method: the caller's TLS identity against one table, default deny.

    METHODS["/gyre.v1.CellAgent/SwitchRole"]          # frozenset({"scheduler"})
    refusal("/gyre.v1.Scheduler/Shutdown", "runner")  # the PERMISSION_DENIED message, or None: allowed
    AuthorizationInterceptor()                        # what gyre.rpc.new_server installs with TLS on

With `tls.enabled` every gRPC server takes only clients with a certificate of the deployment's CA
(gyre.rpc); this says which of those may call what. The caller's identity is the subject common name of
its certificate: `gyre tls init` (`gyre.tls.issue`) and the cert-manager Certificates
(deploy/k8s/components/cert-manager) both name the identity there (the DNS names are host names, not
identities). A method is accepted from the identities that call it in the tree (the comments name the
call sites), plus `cli` on the read-only status methods (an operator's tool); every service's own identity
and `cli` may ask grpc.health.v1 (a container's health check dials as the service's own identity, the
benches as `cli`). A cell's certificate also names its cell (gyre.tls): the methods of `OWN_CELL` it
may call for that cell alone (a notice that it leaves). A method missing from the table is refused to every
identity, so a new RPC is refused until it is added (tests/unit/tls/test_authz.py checks every method of every service in
gyre/v1 has an entry). Refusals answer PERMISSION_DENIED naming the caller's identity and the method, and
are logged (`rpc_refused`).

Plaintext (the embedded default on 127.0.0.1, `tls.enabled` false) has no identity to check: there
new_server installs no interceptor and anything that reaches the port may call anything.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc

from gyre.log import get_logger
from gyre.tls import cell_of_uris

log = get_logger("gyre.authz")

SCHEDULER, PROXY, RUNNER = "scheduler", "proxy", "runner"
EVALUATOR, PACKER, CELL_AGENT = "evaluator", "packer", "cell_agent"
CLI = "cli"
"""Tools outside the deployment: `gyre status`, `gyre demo`, `gyre bench cluster` and `kube`."""
SERVICES = frozenset({SCHEDULER, PROXY, RUNNER, EVALUATOR, PACKER, CELL_AGENT})
IDENTITIES = SERVICES | {"nats", "redis", CLI}
"""Every identity `gyre tls init` issues a certificate for (app/cli/tls.py); `nats` and `redis` are servers
and call no gRPC method."""


def _only(*identities: str) -> frozenset[str]:
    return frozenset(identities)


HEALTH = SERVICES | {CLI}

METHODS: Mapping[str, frozenset[str]] = {
    # grpc.health.v1: app/stack/probe.py (a container's check, as the service's own identity), the benches.
    "/grpc.health.v1.Health/Check": HEALTH,
    "/grpc.health.v1.Health/Watch": HEALTH,
    # Scheduler
    "/gyre.v1.Scheduler/GetState": _only(CLI),  # gyre status, gyre demo, bench/_cluster_run.py, _kube_run.py
    "/gyre.v1.Scheduler/RegisterTrainingCell": _only(CELL_AGENT),  # a satellite (the proto's; no caller yet)
    "/gyre.v1.Scheduler/Shutdown": _only(CLI),  # gyre demo, the end of bench/_cluster_run.py, _kube_run.py
    # gyre cell drain (app/cli/cell.py); a cell for itself alone: `gyre cell notice`, its pod's preStop
    "/gyre.v1.Scheduler/DrainCell": _only(CLI, CELL_AGENT),
    # CellAgent: driven by the scheduler (services/scheduler/executor.py, service.py)
    "/gyre.v1.CellAgent/SwitchRole": _only(SCHEDULER),
    "/gyre.v1.CellAgent/GetStatus": _only(SCHEDULER, CLI),
    "/gyre.v1.CellAgent/JoinBatch": _only(SCHEDULER),
    "/gyre.v1.CellAgent/PublishWeights": _only(SCHEDULER),
    # a satellite from the core (services/cell_agent/published_weights.py)
    "/gyre.v1.CellAgent/FetchPublished": _only(CELL_AGENT),
    # Evaluator: no caller in the tree; read-only
    "/gyre.v1.Evaluator/GetEvaluation": _only(CLI),
    "/gyre.v1.Evaluator/GetStatus": _only(CLI),
    # Packer
    "/gyre.v1.Packer/OpenBatch": _only(SCHEDULER),
    "/gyre.v1.Packer/GetBatch": _only(CLI),  # no caller in the tree; read-only
    # Proxy
    "/gyre.v1.Proxy/OpenExecution": _only(RUNNER),  # services/runner/proxy_client.py
    "/gyre.v1.Proxy/CloseExecution": _only(RUNNER),
    "/gyre.v1.Proxy/UpdateRoutes": _only(SCHEDULER),
    "/gyre.v1.Proxy/Drain": _only(SCHEDULER),
    "/gyre.v1.Proxy/GetStats": _only(CLI),  # gyre status, gyre demo
    # Runner
    "/gyre.v1.Runner/GetStatus": _only(CLI),  # no caller in the tree; read-only
    "/gyre.v1.Runner/CancelExecution": _only(SCHEDULER),
}
"""Full method name → the identities that may call it. Not here: refused to everyone."""

OWN_CELL: Mapping[str, str] = {"/gyre.v1.Scheduler/DrainCell": "cell"}
"""Methods a cell agent may call for its own cell only → the request field naming the cell: the caller's
certificate must name that cell (`gyre.tls.cell_uri`). Other identities the table allows are not limited."""


def own_cell_refusal(
    method: str, identity: str | None, caller_cell: int | None, request: object
) -> str | None:
    """Why a cell agent may not make this call of an `OWN_CELL` method (None: it may, or the rule does not
    apply): the request's cell must be the one its certificate names."""
    field = OWN_CELL.get(method)
    if field is None or identity != CELL_AGENT:
        return None
    if request is None:  # a stream of requests: no one cell to check
        return f"{method} takes one request: an OWN_CELL method cannot stream"
    asked = getattr(request, field)
    if caller_cell != asked:
        named = "names no cell" if caller_cell is None else f"is cell {caller_cell}'s"
        return f"a cell agent may call {method} for its own cell only: its certificate {named}, not cell {asked}'s"
    return None


def refusal(method: str, identity: str | None, table: Mapping[str, frozenset[str]] = METHODS) -> str | None:
    """Why `identity` may not call `method` (the PERMISSION_DENIED details), or None when it may."""
    allowed = table.get(method)
    if identity is None:
        return f"a caller whose certificate names no identity (subject CN) may not call {method}"
    if allowed is None:
        return f"identity {identity!r} may not call {method}: the method is in no entry of gyre.authz.METHODS"
    if identity not in allowed:
        return f"identity {identity!r} may not call {method} (only {', '.join(sorted(allowed))})"
    return None


def peer_cell(context: grpc.aio.ServicerContext[Any, Any]) -> int | None:
    """The cell the caller's certificate names (its `urn:gyre:cell:K` URI), or None."""
    auth = context.auth_context()
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    return cell_of_uris(uri.decode() for uri in auth.get("peer_uri") or [])


def peer_identity(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The caller's identity: the subject common name of its certificate (None without TLS or a CN)."""
    auth = context.auth_context()
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    names = auth.get("x509_common_name") or []
    return names[0].decode() if len(names) == 1 else None


Check = Callable[[grpc.aio.ServicerContext[Any, Any], Any], Awaitable[None]]
"""Awaited with the request (None for a stream of requests) before a handler runs; aborts the call when the
caller may not make it."""


class AuthorizationInterceptor(grpc.aio.ServerInterceptor):
    """Refuses, with PERMISSION_DENIED, every call whose caller's identity `table` does not allow for the
    method, before the handler runs; streaming handlers too (async generators and `context.write` ones).
    A method the server does not serve stays UNIMPLEMENTED."""

    def __init__(self, table: Mapping[str, frozenset[str]] = METHODS) -> None:
        self.table = table

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method: str = handler_call_details.method

        async def check(context: grpc.aio.ServicerContext[Any, Any], request: Any) -> None:
            identity = peer_identity(context)
            why = refusal(method, identity, self.table)
            if why is None and method in OWN_CELL:
                why = own_cell_refusal(method, identity, peer_cell(context), request)
            if why is not None:
                log.warning("rpc_refused", method=method, identity=identity)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)

        return _guarded(handler, check)


def _guarded(handler: grpc.RpcMethodHandler, check: Check) -> grpc.RpcMethodHandler:
    """`handler` with `check(context)` awaited before its behavior, whichever of the four kinds it is."""
    codecs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_one_response(handler.unary_unary, check, True), **codecs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _one_response(handler.stream_unary, check, False), **codecs
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_responses(handler.unary_stream, check, True), **codecs)
    return grpc.stream_stream_rpc_method_handler(_responses(handler.stream_stream, check, False), **codecs)


def _one_response(inner: Callable[..., Any], check: Check, unary: bool) -> Callable[..., Any]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await check(context, request if unary else None)
        result = inner(request, context)
        return await result if inspect.isawaitable(result) else result

    return guarded


def _responses(inner: Callable[..., Any], check: Check, unary: bool) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(inner):

        async def generated(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            await check(context, request if unary else None)
            async for response in inner(request, context):
                yield response

        return generated

    async def written(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await check(context, request if unary else None)  # a handler that writes with context.write
        await inner(request, context)

    return written
