"""Cells that left the pool with notice, as the stack's supervisor learns of them: the scheduler's view.

    gone = await gone_cells(scheduler_port)     # {2}: cells the scheduler shows CELL_ROLE_GONE; None: no answer

A cell given notice (`gyre cell drain ID`, services/scheduler/departure.py) is drained by the scheduler and
then shows CELL_ROLE_GONE in its `GetState`; the supervisor (app/stack/supervisor.py) polls that and stops
the cell's agent as a planned departure: not a failure, not restarted, the run goes on. A cell lost for good
shows GONE too, but its agent has already exited (the supervisor marked it `lost`).
"""

from __future__ import annotations

import grpc

from app.stack.servers import LOOPBACK
from gyre.rpc import aio_channel
from gyre.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

POLL_S = 1.0
"""How often the supervisor asks the scheduler which cells left."""


async def gone_cells(port: int, timeout_s: float = 2.0) -> set[int] | None:
    """The cells the scheduler on loopback `port` shows removed from the pool; None when it does not answer
    (starting, restarting)."""
    async with aio_channel(f"{LOOPBACK}:{port}") as channel:
        try:
            state = await scheduler_pb2_grpc.SchedulerStub(channel).GetState(
                scheduler_pb2.GetStateRequest(), timeout=timeout_s
            )
        except grpc.RpcError:
            return None
    return {c.cell for c in state.cells if c.role == common_pb2.CELL_ROLE_GONE}


def satellite_cell(process: str) -> int | None:
    """The satellite whose cell agent `process` is (`cell_agent-K`, K > 0), else None (cell 0 is the core)."""
    index = process.removeprefix("cell_agent-")
    if index == process or not index.isdigit() or int(index) == 0:
        return None
    return int(index)
