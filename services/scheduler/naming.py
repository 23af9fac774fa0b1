"""Names the scheduler shell shares with the other services: engine ids and roles.

The policy speaks in ints (a cell index, or -1 for the separate pool) and its own Role enum; the
wire speaks in engine id strings and the protos' CellRole.
"""

from __future__ import annotations

from gyre.ids import cell_engine_id
from gyre.v1 import common_pb2 as common
from services.scheduler.policy import SEPARATE_POOL, Engine, Role

_POOL_ID = "pool"


def engine_id(engine: Engine) -> str:
    """`cell-<k>` for a cell's engine, `pool` for the separate pool."""
    return _POOL_ID if engine == SEPARATE_POOL else cell_engine_id(engine)


def engine_index(engine_id_: str) -> Engine:
    """Inverse of `engine_id`; a ValueError names the bad id."""
    if engine_id_ == _POOL_ID:
        return SEPARATE_POOL
    prefix, _, index = engine_id_.partition("-")
    if prefix != "cell" or not index.isdigit():
        raise ValueError(f"engine id must be 'cell-<k>' or 'pool'; got {engine_id_!r}")
    return int(index)


ROLE_TO_PROTO: dict[Role, int] = {
    Role.ROLLOUT: common.CELL_ROLE_ROLLOUT,
    Role.DRAINING: common.CELL_ROLE_DRAINING,
    Role.TRAINING: common.CELL_ROLE_TRAINING,
    # The wire has no role for training → rollout; a returning cell is still training-side.
    Role.RETURNING: common.CELL_ROLE_TRAINING,
    Role.GONE: common.CELL_ROLE_GONE,
}
