"""The cell agent's gRPC API (`gyre.v1.CellAgent`): translates requests into `CellAgent` calls and
domain errors into status codes. Nothing else happens here.

    CellStateError, RoleError      → FAILED_PRECONDITION (wrong role, wrong step, a batch running)
    CellUnavailableError, Timeout  → UNAVAILABLE (collectives forming, weights not yet published)
    ValueError                     → INVALID_ARGUMENT
    SnapshotError                  → INTERNAL
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from gyre.log import bind_context, get_logger
from gyre.v1 import cell_agent_pb2 as pb
from gyre.v1 import cell_agent_pb2_grpc as pb_grpc
from gyre.v1 import common_pb2
from services.cell_agent.agent import ROLE_TO_PROTO, CellAgent, PublishTarget
from services.cell_agent.errors import CellStateError, CellUnavailableError, SnapshotError
from services.cell_agent.roles import Role, RoleError

log = get_logger("gyre.cell_agent.grpc")

T = TypeVar("T")

_ROLES = {common_pb2.CELL_ROLE_ROLLOUT: Role.ROLLOUT, common_pb2.CELL_ROLE_TRAINING: Role.TRAINING}


async def _guard(context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[T]]) -> T:
    try:
        return await call()
    except (CellStateError, RoleError) as e:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
    except (CellUnavailableError, TimeoutError) as e:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
    except SnapshotError as e:
        log.error("snapshot_mismatch", error=str(e))
        await context.abort(grpc.StatusCode.INTERNAL, str(e))
    except ValueError as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    raise AssertionError("unreachable: context.abort raises")


class CellAgentServicer(pb_grpc.CellAgentServicer):
    def __init__(self, agent: CellAgent) -> None:
        self.agent = agent

    async def SwitchRole(
        self, request: pb.SwitchRoleRequest, context: grpc.aio.ServicerContext
    ) -> pb.SwitchRoleResponse:
        bind_context(cell=self.agent.cell)
        role = _ROLES.get(request.role)

        async def call() -> pb.SwitchRoleResponse:
            if role is None:
                raise ValueError(f"role must be CELL_ROLE_ROLLOUT or CELL_ROLE_TRAINING; got {request.role}")
            result = await self.agent.switch_role(role, int(request.weight_version))
            return pb.SwitchRoleResponse(
                role=ROLE_TO_PROTO[result.role.value],
                duration_s=result.duration_s,
                requests_handed_back=result.requests_handed_back,
                weight_version=result.weight_version,
            )

        return await _guard(context, call)

    async def GetStatus(
        self, request: pb.GetCellStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.CellStatus:
        async def call() -> pb.CellStatus:
            view = await self.agent.view()
            return pb.CellStatus(
                cell=view.cell,
                role=ROLE_TO_PROTO[view.role.value],
                engine=common_pb2.EngineEndpoint(
                    engine_id=view.engine_id, url=view.engine_url, cell=view.cell
                ),
                policy_version=view.policy_version or 0,
                engine_weight_version=int(view.engine_weight_version)
                if view.engine_weight_version.isdigit()
                else 0,
                batch_id=view.batch_id,
                microsteps_processed=view.microsteps_processed,
                weights_digest=view.weights_digest,
            )

        return await _guard(context, call)

    async def JoinBatch(
        self, request: pb.JoinBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.JoinBatchResponse:
        bind_context(cell=self.agent.cell, step=request.step)

        async def call() -> pb.JoinBatchResponse:
            outcome = await self.agent.join_batch(request.batch_id, int(request.step), request.final_in_burst)
            return pb.JoinBatchResponse(
                microsteps=outcome.microsteps,
                policy_version=outcome.policy_version or 0,
                loss=outcome.loss,
                cells=list(outcome.cells),
                participated=outcome.participated,
            )

        return await _guard(context, call)

    async def PublishWeights(
        self, request: pb.PublishWeightsRequest, context: grpc.aio.ServicerContext
    ) -> pb.PublishWeightsResponse:
        async def call() -> pb.PublishWeightsResponse:
            targets = [PublishTarget(e.engine_id, e.url, e.cell) for e in request.engines] or None
            result = await self.agent.publish_weights(targets)
            return pb.PublishWeightsResponse(
                policy_version=result.policy_version, duration_s=result.duration_s
            )

        return await _guard(context, call)
