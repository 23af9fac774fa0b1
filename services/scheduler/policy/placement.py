"""Which rollout engine serves each running execution, and how full every engine is.

The ledger (C_R, the start rule, the waterlevel) only needs totals; placement is what makes a role
transition executable: when a cell leaves rollout, its executions are rerouted (`reroute.py` order)
onto engines with free capacity, which Eq. 2 guarantees exist.

A StartExecutions action reserves capacity before the shell reports the executions' ids. If the cell
leaves rollout in between, the reservation moves with the rest and the late ExecutionStarted is
answered with a reroute to wherever its slot went.

A pool that changes adds three cases. A cell that joins gets a slot of its own (`add_cell`), empty and
not serving until it holds current weights. A cell that leaves or is lost while every engine is full
spreads its executions beyond the others' capacity (Eq. 2 guarded only voluntary moves). And if no
engine serves at all, its executions are *orphaned*: they wait, counted as running, and the next cell
that starts serving adopts them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Final

from services.scheduler.policy.actions import RerouteExecutions
from services.scheduler.policy.reroute import spread_destinations
from services.scheduler.policy.roles import Engine

_ORPHANED: Final = -1
"""A forward to no engine: the reservation waits for the next engine that starts serving."""


class Placement:
    """Per-engine occupancy: bound executions by id, plus reservations not yet bound to an id.

    Engine e has slot e + 1: the separate pool (-1) is slot 0, cell k is slot k + 1."""

    __slots__ = (
        "_capacity",
        "_cell_capacity",
        "_forward",
        "_load",
        "_members",
        "_orphan_unbound",
        "_orphans",
        "_serving",
        "_unbound",
        "_where",
        "rollout_capacity",
    )

    def __init__(self, *, num_cells: int, cell_capacity: int, separate_pool_capacity: int) -> None:
        slots = num_cells + 1
        self._cell_capacity = cell_capacity
        self._capacity = [separate_pool_capacity] + [cell_capacity] * num_cells
        self._serving = [separate_pool_capacity > 0] + [True] * num_cells
        self._load = [0] * slots
        self._unbound = [0] * slots
        self._members: list[dict[str, None]] = [{} for _ in range(slots)]
        self._forward: list[deque[int]] = [deque() for _ in range(slots)]
        self._where: dict[str, int] = {}
        self._orphans: dict[str, Engine] = {}
        """Executions no engine serves, by the engine they lost."""
        self._orphan_unbound = 0
        self.rollout_capacity = sum(c for c, s in zip(self._capacity, self._serving, strict=True) if s)
        """C_R: capacity of every engine that serves rollout."""

    def _slot(self, engine: Engine) -> int:
        if not -1 <= engine < len(self._load) - 1:
            raise ValueError(
                f"engine must be a cell index in [0, {len(self._load) - 1}) or -1 (pool); got {engine}"
            )
        return engine + 1

    @property
    def num_cells(self) -> int:
        """Cell slots: every cell id ever used (gone ones included)."""
        return len(self._load) - 1

    @property
    def running(self) -> int:
        """Executions holding rollout capacity (bound, reserved or orphaned)."""
        return sum(self._load) + len(self._orphans) + self._orphan_unbound

    @property
    def orphaned(self) -> int:
        """Executions (and reservations) waiting for an engine."""
        return len(self._orphans) + self._orphan_unbound

    def load(self, engine: Engine) -> int:
        return self._load[self._slot(engine)]

    def loads(self) -> dict[Engine, int]:
        return {s - 1: n for s, n in enumerate(self._load)}

    def free(self, engine: Engine) -> int:
        slot = self._slot(engine)
        return self._capacity[slot] - self._load[slot] if self._serving[slot] else 0

    def serving(self, engine: Engine) -> bool:
        return self._serving[self._slot(engine)]

    def engine_of(self, execution_id: str) -> Engine:
        """The engine an execution's calls go to (for an orphan, the one it lost)."""
        if execution_id in self._orphans:
            return self._orphans[execution_id]
        return self._where[execution_id] - 1

    def assignments(self) -> dict[str, Engine]:
        """Every started execution and the engine its calls go to (for persistence and status)."""
        bound = {execution_id: slot - 1 for execution_id, slot in self._where.items()}
        return bound | self._orphans

    def reserve(self, engine: Engine, count: int) -> None:
        """Hold `count` slots on `engine` for executions about to start there."""
        slot = self._slot(engine)
        assert self._serving[slot] and self._load[slot] + count <= self._capacity[slot], (
            "reserve past capacity"
        )
        self._load[slot] += count
        self._unbound[slot] += count

    def bind(self, execution_id: str, engine: Engine) -> Engine | None:
        """An execution started on `engine`; returns the engine it must move to if its slot moved (None:
        it stays, or its slot waits for an engine, which will adopt it)."""
        if execution_id in self._where or execution_id in self._orphans:
            raise ValueError(f"execution {execution_id!r} started twice")
        slot = self._slot(engine)
        dest = slot
        # A reservation that moved away (possibly more than once) is followed to where it is now.
        while self._forward[dest] and not (dest != slot and self._unbound[dest] > 0 and self._serving[dest]):
            dest = self._forward[dest].popleft()
            if dest == _ORPHANED:
                self._orphan_unbound -= 1
                self._orphans[execution_id] = engine
                return None
        if self._unbound[dest] == 0:
            raise ValueError(
                f"execution {execution_id!r} started on engine {engine} without a reservation there"
            )
        moved_to = None if dest == slot else dest - 1
        self._unbound[dest] -= 1
        self._members[dest][execution_id] = None
        self._where[execution_id] = dest
        return moved_to

    def release(self, execution_id: str) -> Engine:
        """An execution ended: free its slot."""
        if execution_id in self._orphans:
            return self._orphans.pop(execution_id)
        slot = self._where.pop(execution_id, None)
        if slot is None:
            raise ValueError(f"execution {execution_id!r} terminated but was never started")
        del self._members[slot][execution_id]
        self._load[slot] -= 1
        return slot - 1

    def stop_serving(
        self, cell: int, order: Sequence[Engine], *, recompute: bool = False
    ) -> list[RerouteExecutions]:
        """`cell` leaves rollout: move its executions and reservations to engines in `order`, beyond their
        capacity if they are full, or orphan them if no engine serves (`recompute`: the cell is lost)."""
        slot = self._slot(cell)
        assert self._serving[slot], f"cell {cell} is not serving rollout"
        self._serving[slot] = False
        self.rollout_capacity -= self._capacity[slot]
        ids = list(self._members[slot])
        reserved = self._unbound[slot]
        plan, left = spread_destinations(order, self.free, len(ids) + reserved, exclude=cell)
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
                actions.append(RerouteExecutions(cell, dest_engine, tuple(moved), recompute))
            if take > bound:
                self._unbound[dest] += take - bound
                self._forward[slot].extend([dest] * (take - bound))
            self._load[dest] += take
        if left:
            for execution_id in ids[pos:]:
                del self._where[execution_id]
                self._orphans[execution_id] = cell
            orphaned_reservations = left - (len(ids) - pos)
            self._orphan_unbound += orphaned_reservations
            self._forward[slot].extend([_ORPHANED] * orphaned_reservations)
        self._members[slot] = {}
        self._unbound[slot] = 0
        self._load[slot] = 0
        return actions

    def start_serving(self, cell: int) -> list[RerouteExecutions]:
        """`cell` serves rollout again (empty, unless orphaned executions wait: it adopts them all)."""
        slot = self._slot(cell)
        assert not self._serving[slot], f"cell {cell} already serves rollout"
        self._serving[slot] = True
        self.rollout_capacity += self._capacity[slot]
        by_source: dict[Engine, list[str]] = {}
        for execution_id, source in self._orphans.items():
            by_source.setdefault(source, []).append(execution_id)
            self._members[slot][execution_id] = None
            self._where[execution_id] = slot
        self._load[slot] += len(self._orphans) + self._orphan_unbound
        self._unbound[slot] += self._orphan_unbound
        if self._orphan_unbound:
            for forward in self._forward:
                for i, dest in enumerate(forward):
                    if dest == _ORPHANED:
                        forward[i] = slot
        self._orphans = {}
        self._orphan_unbound = 0
        return [RerouteExecutions(source, cell, tuple(ids), True) for source, ids in by_source.items()]

    def add_cell(self) -> int:
        """A new cell's slot, empty and not serving (it starts serving once it holds current weights)."""
        self._capacity.append(self._cell_capacity)
        self._serving.append(False)
        self._load.append(0)
        self._unbound.append(0)
        self._members.append({})
        self._forward.append(deque())
        return len(self._load) - 2

    def to_dict(self) -> dict[str, Any]:
        """Everything but the capacities (which come from the params): JSON-able, see `from_dict`."""
        return {
            "serving": list(self._serving),
            "load": list(self._load),
            "unbound": list(self._unbound),
            "members": [list(m) for m in self._members],
            "forward": [list(f) for f in self._forward],
            "orphans": dict(self._orphans),
            "orphan_unbound": self._orphan_unbound,
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, cell_capacity: int, separate_pool_capacity: int
    ) -> Placement:
        slots = len(data["serving"])
        if slots < 1 or any(len(data[k]) != slots for k in ("load", "unbound", "members", "forward")):
            raise ValueError("stored placement lists do not have one entry per engine slot")
        p = cls(
            num_cells=slots - 1, cell_capacity=cell_capacity, separate_pool_capacity=separate_pool_capacity
        )
        p._serving = [bool(x) for x in data["serving"]]
        p._load = [int(x) for x in data["load"]]
        p._unbound = [int(x) for x in data["unbound"]]
        p._members = [dict.fromkeys(str(e) for e in m) for m in data["members"]]
        p._forward = [deque(int(x) for x in f) for f in data["forward"]]
        p._where = {e: slot for slot, members in enumerate(p._members) for e in members}
        p._orphans = {str(e): int(c) for e, c in data.get("orphans", {}).items()}
        p._orphan_unbound = int(data.get("orphan_unbound", 0))
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
        over = [s - 1 for s in range(len(self._load)) if self._load[s] > self._capacity[s]]
        if over:
            raise ValueError(f"running executions exceed the capacity of engines {over}")
