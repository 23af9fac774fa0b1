"""The cell agent's gRPC API (`gyre.v1.CellAgent`): translates requests into `CellAgent` calls. Nothing
else happens here; the status code of each domain error is `errors.ERROR_STATUSES`, applied by the
server's interceptor (`gyre.rpc`). The interceptor guards unary calls; the one stream, FetchPublished,
maps its two errors itself (a publication no longer on the core: NOT_FOUND).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from gyre.log import bind_context
from gyre.roles import ROLLOUT, TRAINING
from gyre.v1 import cell_agent_pb2 as pb
from gyre.v1 import cell_agent_pb2_grpc as pb_grpc
from gyre.v1 import common_pb2
from services.cell_agent.agent import CellAgent, PublishTarget
from services.cell_agent.errors import CellStateError
from services.cell_agent.published_weights import PublicationGone


class CellAgentServicer(pb_grpc.CellAgentServicer):
    def __init__(self, agent: CellAgent) -> None:
        self.agent = agent

    async def SwitchRole(
        self, request: pb.SwitchRoleRequest, context: grpc.aio.ServicerContext
    ) -> pb.SwitchRoleResponse:
        bind_context(cell=self.agent.cell)
        if request.role not in (ROLLOUT, TRAINING):
            raise ValueError(f"role must be CELL_ROLE_ROLLOUT or CELL_ROLE_TRAINING; got {request.role}")
        result = await self.agent.switch_role(request.role, int(request.weight_version))
        return pb.SwitchRoleResponse(
            role=result.role,
            duration_s=result.duration_s,
            requests_handed_back=result.requests_handed_back,
            weight_version=result.weight_version,
        )

    async def GetStatus(
        self, request: pb.GetCellStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.CellStatus:
        view = await self.agent.view()
        return pb.CellStatus(
            cell=view.cell,
            role=view.role,
            engine=common_pb2.EngineEndpoint(engine_id=view.engine_id, url=view.engine_url, cell=view.cell),
            policy_version=view.policy_version or 0,
            engine_weight_version=int(view.engine_weight_version)
            if view.engine_weight_version.isdigit()
            else 0,
            batch_id=view.batch_id,
            microsteps_processed=view.microsteps_processed,
            weights_digest=view.weights_digest,
        )

    async def JoinBatch(
        self, request: pb.JoinBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.JoinBatchResponse:
        bind_context(cell=self.agent.cell, step=request.step)
        outcome = await self.agent.join_batch(request.batch_id, int(request.step), request.final_in_burst)
        return pb.JoinBatchResponse(
            microsteps=outcome.microsteps,
            policy_version=outcome.policy_version or 0,
            loss=outcome.loss,
            cells=list(outcome.cells),
            participated=outcome.participated,
        )

    async def PublishWeights(
        self, request: pb.PublishWeightsRequest, context: grpc.aio.ServicerContext
    ) -> pb.PublishWeightsResponse:
        targets = [PublishTarget(e.engine_id, e.url, e.cell) for e in request.engines] or None
        result = await self.agent.publish_weights(targets)
        return pb.PublishWeightsResponse(policy_version=result.policy_version, duration_s=result.duration_s)

    async def FetchPublished(
        self, request: pb.FetchPublishedRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PublishedChunk]:
        try:
            async for chunk in self.agent.stream_published(int(request.policy_version)):
                yield chunk
        except PublicationGone as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except CellStateError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
