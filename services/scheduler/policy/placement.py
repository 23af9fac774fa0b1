"""Which rollout engine serves each running execution, and how full every engine is.

The ledger (C_R, the start rule, the waterlevel) only needs totals; placement is what makes a role
transition executable: when a cell leaves rollout, its executions are rerouted (`reroute.py` order)
onto engines with free capacity, which Eq. 2 guarantees exist.

A StartExecutions action reserves capacity before the shell reports the executions' ids. If the cell
leaves rollout in between, the reservation moves with the rest and the late ExecutionStarted is
answered with a reroute to wherever its slot went.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from services.scheduler.policy.actions import RerouteExecutions
from services.scheduler.policy.reroute import fill_destinations
from services.scheduler.policy.roles import SEPARATE_POOL, Engine


class Placement:
    """Per-engine occupancy: bound executions by id, plus reservations not yet bound to an id."""

    __slots__ = (
        "_capacity",
        "_forward",
        "_load",
        "_members",
        "_pool_slot",
        "_serving",
        "_unbound",
        "_where",
        "rollout_capacity",
    )

    def __init__(self, *, num_cells: int, cell_capacity: int, separate_pool_capacity: int) -> None:
        slots = num_cells + 1
        self._pool_slot = num_cells
        self._capacity = [cell_capacity] * num_cells + [separate_pool_capacity]
        self._serving = [True] * num_cells + [separate_pool_capacity > 0]
        self._load = [0] * slots
        self._unbound = [0] * slots
        self._members: list[dict[str, None]] = [{} for _ in range(slots)]
        self._forward: list[deque[int]] = [deque() for _ in range(slots)]
        self._where: dict[str, int] = {}
        self.rollout_capacity = sum(c for c, s in zip(self._capacity, self._serving, strict=True) if s)
        """C_R: capacity of every engine that serves rollout."""

    def _slot(self, engine: Engine) -> int:
        if engine == SEPARATE_POOL:
            return self._pool_slot
        if not 0 <= engine < self._pool_slot:
            raise ValueError(
                f"engine must be a cell index in [0, {self._pool_slot}) or -1 (pool); got {engine}"
            )
        return engine

    def _engine(self, slot: int) -> Engine:
        return SEPARATE_POOL if slot == self._pool_slot else slot

    @property
    def running(self) -> int:
        """Executions holding rollout capacity (bound or reserved)."""
        return sum(self._load)

    def load(self, engine: Engine) -> int:
        return self._load[self._slot(engine)]

    def loads(self) -> dict[Engine, int]:
        return {self._engine(s): n for s, n in enumerate(self._load)}

    def free(self, engine: Engine) -> int:
        slot = self._slot(engine)
        return self._capacity[slot] - self._load[slot] if self._serving[slot] else 0

    def serving(self, engine: Engine) -> bool:
        return self._serving[self._slot(engine)]

    def engine_of(self, execution_id: str) -> Engine:
        return self._engine(self._where[execution_id])

    def assignments(self) -> dict[str, Engine]:
        """Every started execution and the engine its calls go to (for persistence and status)."""
        return {execution_id: self._engine(slot) for execution_id, slot in self._where.items()}

    def reserve(self, engine: Engine, count: int) -> None:
        """Hold `count` slots on `engine` for executions about to start there."""
        slot = self._slot(engine)
        assert self._serving[slot] and self._load[slot] + count <= self._capacity[slot], (
            "reserve past capacity"
        )
        self._load[slot] += count
        self._unbound[slot] += count

    def bind(self, execution_id: str, engine: Engine) -> Engine | None:
        """An execution started on `engine`; returns the engine it must move to if its slot moved."""
        if execution_id in self._where:
            raise ValueError(f"execution {execution_id!r} started twice")
        slot = self._slot(engine)
        dest = slot
        # A reservation that moved away (possibly more than once) is followed to where it is now.
        while self._forward[dest] and not (dest != slot and self._unbound[dest] > 0 and self._serving[dest]):
            dest = self._forward[dest].popleft()
        if self._unbound[dest] == 0:
            raise ValueError(
                f"execution {execution_id!r} started on engine {engine} without a reservation there"
            )
        moved_to = None if dest == slot else self._engine(dest)
        self._unbound[dest] -= 1
        self._members[dest][execution_id] = None
        self._where[execution_id] = dest
        return moved_to

    def release(self, execution_id: str) -> Engine:
        """An execution ended: free its slot."""
        slot = self._where.pop(execution_id, None)
        if slot is None:
            raise ValueError(f"execution {execution_id!r} terminated but was never started")
        del self._members[slot][execution_id]
        self._load[slot] -= 1
        return self._engine(slot)

    def stop_serving(self, cell: int, order: Sequence[Engine]) -> list[RerouteExecutions]:
        """`cell` leaves rollout: move its executions and reservations to engines in `order`."""
        slot = self._slot(cell)
        assert self._serving[slot], f"cell {cell} is not serving rollout"
        self._serving[slot] = False
        self.rollout_capacity -= self._capacity[slot]
        ids = list(self._members[slot])
        reserved = self._unbound[slot]
        plan = fill_destinations(order, self.free, len(ids) + reserved, exclude=cell)
        actions: list[RerouteExecutions] = []
        pos = 0
        for dest_engine, take in plan:
            dest = self._slot(dest_engine)
            bound = min(take, len(ids) - pos)
            if bound:
                moved = ids[pos : pos + bound]
                pos += bound
                for execution_id in moved:
                    self._members[dest][execution_id] = None
                    self._where[execution_id] = dest
                actions.append(RerouteExecutions(cell, dest_engine, tuple(moved)))
            if take > bound:
                self._unbound[dest] += take - bound
                self._forward[slot].extend([dest] * (take - bound))
            self._load[dest] += take
        self._members[slot] = {}
        self._unbound[slot] = 0
        self._load[slot] = 0
        return actions

    def start_serving(self, cell: int) -> None:
        """`cell` serves rollout again (empty)."""
        slot = self._slot(cell)
        assert not self._serving[slot], f"cell {cell} already serves rollout"
        self._serving[slot] = True
        self.rollout_capacity += self._capacity[slot]

    def to_dict(self) -> dict[str, Any]:
        """Everything but the capacities (which come from the params): JSON-able, see `from_dict`."""
        return {
            "serving": list(self._serving),
            "load": list(self._load),
            "unbound": list(self._unbound),
            "members": [list(m) for m in self._members],
            "forward": [list(f) for f in self._forward],
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, num_cells: int, cell_capacity: int, separate_pool_capacity: int
    ) -> Placement:
        p = cls(
            num_cells=num_cells, cell_capacity=cell_capacity, separate_pool_capacity=separate_pool_capacity
        )
        slots = num_cells + 1
        if any(len(data[k]) != slots for k in ("serving", "load", "unbound", "members", "forward")):
            raise ValueError(f"stored placement does not have {slots} engine slots (num_cells changed?)")
        p._serving = [bool(x) for x in data["serving"]]
        p._load = [int(x) for x in data["load"]]
        p._unbound = [int(x) for x in data["unbound"]]
        p._members = [dict.fromkeys(str(e) for e in m) for m in data["members"]]
        p._forward = [deque(int(x) for x in f) for f in data["forward"]]
        p._where = {e: slot for slot, members in enumerate(p._members) for e in members}
        p.rollout_capacity = sum(c for c, s in zip(p._capacity, p._serving, strict=True) if s)
        return p

    def restore(self, running: Mapping[str, Engine]) -> None:
        """Rebind executions that were running before a restart (their engines must serve rollout)."""
        for execution_id, engine in running.items():
            slot = self._slot(engine)
            if not self._serving[slot]:
                raise ValueError(
                    f"execution {execution_id!r} is on engine {engine}, which does not serve rollout"
                )
            self._load[slot] += 1
            self._members[slot][execution_id] = None
            self._where[execution_id] = slot
        over = [self._engine(s) for s in range(len(self._load)) if self._load[s] > self._capacity[s]]
        if over:
            raise ValueError(f"running executions exceed the capacity of engines {over}")
