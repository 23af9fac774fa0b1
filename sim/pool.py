"""Pool scenarios: how the simulated cluster's cells come and go while the run goes on.

    gyre sim run --preset paper --pool spot --json

    fixed     the paper's setting: the preset's K cells for the whole run
    spot      spot capacity: cells are reclaimed at random (`reclaims_per_cell_h`), each with
              `notice_s` of notice; the capacity comes back as a new cell `return_after_h` later
    failures  node failures (`failures_per_node_h`): the cell holding the node is lost for good, with no
              notice; a replacement cell joins `replace_after_h` later (None: never)
    grow      capacity added mid-run: `grow_cells` × K new cells, one every `grow_every_h` from `grow_from_h`

Every number is assumed (the paper runs a fixed pool): they are chosen to make the effects visible
within a 12-step run, not measured. The costs a changing pool adds are explicit and documented on
`PoolScenario`: a joining cell's start, an execution's prefix recompute after its cell was lost, the
checkpoint lag that decides how many steps a lost core takes with it, a new core's restore, and the
stop-the-world restart a static baseline pays for a lost cell.

Removals arrive as a Poisson process at a constant rate (of the initial pool's size) and pick their
victim uniformly among the cells present then (`u` of the event), so every mode sees the same removal
times under one seed. A removal that would leave fewer than `min_cells` cells is skipped, and so is
its return or replacement.

    schedule = PoolSchedule(POOLS["spot"], num_cells=8, cell_nodes=4, seed=0)
    while schedule.next_s <= now: time_s, kind, value = schedule.pop()
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

JOIN, LEAVE, LOSE, NOTICE_END = range(4)
"""Pool event kinds: a cell joins; one gets notice (value: the victim draw u); one is lost (u); a
notice runs out (value: the cell)."""


@dataclass(frozen=True, slots=True)
class PoolScenario:
    name: str
    description: str
    reclaims_per_cell_h: float = 0.0
    """Spot reclaims per cell-hour (each with notice)."""
    notice_s: float = 120.0
    """A reclaim's notice: the cell is lost if it has not been let go by then (a training core hands over
    only at a step boundary)."""
    return_after_h: float | None = None
    """A reclaimed cell's capacity comes back (as a new cell) this long after the notice; None: never."""
    failures_per_node_h: float = 0.0
    """Node failures per node-hour; a failure loses the node's whole cell, with no notice."""
    replace_after_h: float | None = None
    """A failed cell is replaced by a new one this long after the failure; None: never."""
    grow_cells: float = 0.0
    """Cells added mid-run, as a multiple of the initial K (rounded)."""
    grow_from_h: float = 0.0
    grow_every_h: float = 1.0
    min_cells: int = 2
    """A removal that would leave fewer cells in the pool is skipped."""
    cell_start_s: float = 300.0
    """A joining cell, from entering the pool to serving: engine start and loading the published weights
    (a reload after a newer publication takes the preset's `publish_s`)."""
    recompute_s: float = 60.0
    """Extra time of an execution rerouted from a lost cell: its prefix is recomputed (no KV migration)."""
    checkpoint_s: float = 300.0
    """The core's checkpoint after every step becomes durable this long after the step (a core lost
    before that takes the step with it: its successor takes it again)."""
    restore_s: float = 120.0
    """A new core loads the core state (handed over, or the newest checkpoint) before its replay."""
    restart_s: float = 900.0
    """A static baseline (async, colocate) restarts the whole job after a lost cell: every engine and
    trainer stops for this long (process groups rebuilt, engines and trainers reloaded), the open batch's
    gradients are lost and every running execution recomputes its prefix. Elastic pays none of it."""

    @property
    def changes(self) -> bool:
        return bool(self.reclaims_per_cell_h or self.failures_per_node_h or self.grow_cells)

    def parameters(self) -> dict[str, Any]:
        """The scenario's numbers, for the report."""
        return {k: v for k, v in asdict(self).items() if k not in ("name", "description")}


POOLS: Mapping[str, PoolScenario] = MappingProxyType(
    {
        p.name: p
        for p in (
            PoolScenario("fixed", "the preset's K cells for the whole run (the paper's setting)"),
            PoolScenario(
                "spot",
                "spot capacity: a reclaim per 10 cell-hours, 2 min notice, the capacity back after 1 h",
                reclaims_per_cell_h=0.1,
                notice_s=120.0,
                return_after_h=1.0,
            ),
            PoolScenario(
                "failures",
                "node failures, one per 200 node-hours, each losing its cell for good; a replacement after 2 h",
                failures_per_node_h=1 / 200,
                replace_after_h=2.0,
            ),
            PoolScenario(
                "grow",
                "capacity added mid-run: K/2 more cells, one an hour from hour 2",
                grow_cells=0.5,
                grow_from_h=2.0,
                grow_every_h=1.0,
            ),
        )
    }
)
"""Every pool scenario by name (`gyre sim run --pool NAME`). To add one: a PoolScenario here whose
description says what it models; its numbers are documented on the fields above."""


class PoolSchedule:
    """The scenario's events in time order. Removals are drawn lazily; a removal's return or replacement
    is planned by the simulation (`plan`) once the removal happened."""

    def __init__(self, scenario: PoolScenario, *, num_cells: int, cell_nodes: int, seed: int) -> None:
        self.scenario = scenario
        self._rng = random.Random(f"pool:{scenario.name}:{seed}")
        self._heap: list[tuple[float, int, int, float]] = []
        self._seq = 0
        self._rates: list[tuple[int, float]] = []
        if scenario.reclaims_per_cell_h > 0:
            self._rates.append((LEAVE, scenario.reclaims_per_cell_h * num_cells / 3600.0))
        if scenario.failures_per_node_h > 0:
            self._rates.append((LOSE, scenario.failures_per_node_h * num_cells * cell_nodes / 3600.0))
        for kind, rate in self._rates:
            self._draw_next(kind, rate, 0.0)
        for i in range(round(scenario.grow_cells * num_cells)):
            self.plan((scenario.grow_from_h + i * scenario.grow_every_h) * 3600.0, JOIN)

    def _draw_next(self, kind: int, rate: float, after_s: float) -> None:
        gap_s = self._rng.expovariate(rate)
        self.plan(after_s + gap_s, kind, self._rng.random())

    @property
    def next_s(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def plan(self, time_s: float, kind: int, value: float = 0.0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, kind, value))

    def pop(self) -> tuple[float, int, float]:
        time_s, _, kind, value = heapq.heappop(self._heap)
        for rate_kind, rate in self._rates:
            if rate_kind == kind:
                self._draw_next(kind, rate, time_s)
        return time_s, kind, value
