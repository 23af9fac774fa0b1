"""A cell's role as the wire carries it (`gyre.v1.CellRole`), and its name in logs, metrics and the CLI.

The scheduler's policy holds the one `Role` enum (services/scheduler/policy/roles.py: rollout, draining,
training, returning) and the scheduler shell the one mapping of it onto the wire
(services/scheduler/naming.py, `ROLE_TO_PROTO`). A cell agent holds its own role as the wire value it
reports (ROLLOUT, DRAINING while it moves either way, TRAINING), so nothing else translates roles.

    role_name(TRAINING) == "training"
"""

from __future__ import annotations

from typing import Final

from gyre.v1 import common_pb2

CellRole = common_pb2.CellRole.ValueType
"""A `gyre.v1.CellRole` value."""

ROLLOUT: Final[CellRole] = common_pb2.CELL_ROLE_ROLLOUT
DRAINING: Final[CellRole] = common_pb2.CELL_ROLE_DRAINING
TRAINING: Final[CellRole] = common_pb2.CELL_ROLE_TRAINING


def role_name(role: CellRole) -> str:
    """`rollout`, `draining`, `training` (the proto name without its prefix, lower case)."""
    return common_pb2.CellRole.Name(role).removeprefix("CELL_ROLE_").lower()
