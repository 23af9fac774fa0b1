"""The proxy's gRPC API (protos/gyre/v1/proxy.proto): a thin translation onto `ProxyCore`.

Domain errors map to status codes in `ERROR_STATUSES` and nowhere else (applied by the server's
interceptor, `gyre.rpc`): a bad argument (unknown profile, empty id) is INVALID_ARGUMENT, an unknown
execution or engine NOT_FOUND, opening a closed execution or draining without a destination
FAILED_PRECONDITION.
"""

from __future__ import annotations

from typing import Any

import grpc

from gyre.rpc import INVALID_ARGUMENT, ErrorStatus
from gyre.store.trees import UnknownTreeError
from gyre.v1 import proxy_pb2 as pb
from gyre.v1 import proxy_pb2_grpc
from services.proxy.core import ProxyCore
from services.proxy.errors import ExecutionClosedError
from services.proxy.executions import UnknownExecutionError
from services.proxy.routing import EngineSpec, NoDestinationError, UnknownEngineError


def _unknown(e: BaseException) -> str:
    return f"unknown: {e.args[0] if e.args else e}"


ERROR_STATUSES = (
    ErrorStatus(
        (UnknownExecutionError, UnknownTreeError, UnknownEngineError), grpc.StatusCode.NOT_FOUND, _unknown
    ),
    ErrorStatus((ExecutionClosedError, NoDestinationError), grpc.StatusCode.FAILED_PRECONDITION),
    INVALID_ARGUMENT,
)
"""The status of each domain error the proxy's gRPC handlers raise (first match wins)."""


class ProxyServicer(proxy_pb2_grpc.ProxyServicer):
    def __init__(self, core: ProxyCore) -> None:
        self.core = core

    async def OpenExecution(
        self, request: pb.OpenExecutionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OpenExecutionResponse:
        ref = request.execution
        extra = {
            "group_id": ref.group_id,
            "index_in_group": str(ref.index_in_group),
            "query_id": ref.query_id,
        }
        key = await self.core.open_execution(
            ref.execution_id,
            profile=request.profile,
            engine_id=request.engine_id,
            policy_version=request.policy_version,
            extra=extra,
        )
        return pb.OpenExecutionResponse(base_url=self.core.base_url, api_key=key)

    async def CloseExecution(
        self, request: pb.CloseExecutionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CloseExecutionResponse:
        summary = await self.core.close_execution(request.execution_id)
        return pb.CloseExecutionResponse(
            num_calls=summary.num_calls,
            num_nodes=summary.num_nodes,
            num_sampled_tokens=summary.num_sampled_tokens,
        )

    async def UpdateRoutes(
        self, request: pb.UpdateRoutesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UpdateRoutesResponse:
        for e in request.engines:
            if not e.engine_id or not e.url:
                raise ValueError("every engine needs an engine_id and a url")
        engines = [EngineSpec(e.engine_id, e.url, e.cell) for e in request.engines]
        routes = {r.execution_id: r.engine_id for r in request.routes}
        held = await self.core.update_routes(engines, routes, request.default_engine_id)
        return pb.UpdateRoutesResponse(num_routes=held)

    async def Drain(
        self, request: pb.DrainRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DrainResponse:
        result = await self.core.drain(
            request.engine_id, list(request.destination_engine_ids), request.migrate_kv
        )
        return pb.DrainResponse(
            executions_moved=result.executions_moved,
            calls_rerouted=result.calls_rerouted,
            kv_migrated_tokens=result.kv_migrated_tokens,
        )

    async def GetStats(
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ProxyStats:
        s = self.core.metrics.stats
        return pb.ProxyStats(
            requests=s.requests,
            client_errors=s.client_errors,
            server_errors=s.server_errors,
            reroutes=s.reroutes,
            kv_migrated_tokens=s.kv_migrated_tokens,
            open_executions=self.core.executions.num_open,
            errors_during_transitions=s.errors_during_transitions,
            recorded_calls=s.recorded_calls,
            history_mismatches=s.history_mismatches,
            side_calls=s.side_calls,
            refused_calls=s.refused_calls,
            refusal_messages=s.refusal_messages,
            chat_template=self._chat_template(),
        )

    def _chat_template(self) -> pb.ChatTemplateInfo:
        template = self.core.template
        substitution = getattr(template, "substitution", None)
        if substitution is None:
            return pb.ChatTemplateInfo(name=template.name, source="model")
        return pb.ChatTemplateInfo(
            name=template.name,
            source="registry",
            family=substitution.family,
            replaced=substitution.shipped,
            replaced_breaks=list(substitution.shipped_breaks),
        )
