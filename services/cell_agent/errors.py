"""Domain errors of the cell agent, and the gRPC status each answers with.

CellStateError, RoleError      → FAILED_PRECONDITION (wrong role, wrong step, a batch running)
CellUnavailableError, Timeout  → UNAVAILABLE (collectives forming, weights not yet published)
TransportError                 → UNAVAILABLE (logged: the weight transport failed to expose or read a
                                 snapshot; the scheduler retries the call, which exposes it again)
SnapshotError                  → INTERNAL (logged: corruption, not a race)
ValueError                     → INVALID_ARGUMENT
"""

from __future__ import annotations

import grpc

from gyre.rpc import INVALID_ARGUMENT, ErrorStatus
from gyre.weights.transports.base import TransportError
from services.cell_agent.roles import RoleError


class CellStateError(ValueError):
    """The request does not fit the cell's state (wrong role, wrong step, a batch running):
    FAILED_PRECONDITION."""


class CellUnavailableError(RuntimeError):
    """The cell cannot serve the request yet (collectives still forming, weights not published): UNAVAILABLE."""


class SnapshotError(RuntimeError):
    """A pulled snapshot does not match the core's digest (corruption, not a race): INTERNAL."""


ERROR_STATUSES = (
    ErrorStatus((CellStateError, RoleError), grpc.StatusCode.FAILED_PRECONDITION),
    ErrorStatus((CellUnavailableError, TimeoutError), grpc.StatusCode.UNAVAILABLE),
    ErrorStatus(SnapshotError, grpc.StatusCode.INTERNAL, log_event="snapshot_mismatch"),
    ErrorStatus(TransportError, grpc.StatusCode.UNAVAILABLE, log_event="weight_transport_failed"),
    INVALID_ARGUMENT,
)
"""The status of each domain error the cell agent's gRPC handlers raise (first match wins)."""
