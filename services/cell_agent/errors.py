"""Domain errors of the cell agent; the gRPC servicer maps them to status codes."""

from __future__ import annotations


class CellStateError(ValueError):
    """The request does not fit the cell's state (wrong role, wrong step, a batch running):
    FAILED_PRECONDITION."""


class CellUnavailableError(RuntimeError):
    """The cell cannot serve the request yet (collectives still forming, weights not published): UNAVAILABLE."""


class SnapshotError(RuntimeError):
    """A pulled snapshot does not match the core's digest (corruption, not a race): INTERNAL."""
