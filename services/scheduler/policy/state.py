"""The policy's whole mutable state, and the read-only snapshot it shows to `gyre status`.

`PolicyState` is small on purpose: the service persists the counters d/p/f, the cell roles and the
versions, and after a restart rebuilds the policy with `PolicyState.restore(...)` (plus the running
executions' engines and the outstanding groups, which Redis and the proxy also hold).

The pool: `roles` has one entry per cell id ever used (ids are dense, never reused; a cell that left
is GONE, one still loading weights JOINING); `members` lists the cells that make up K — they hold
current weights — in membership order: members[0] is the core, training cells are a prefix of it, and
a cell that became ready later comes later. With a fixed pool it is simply [0, 1, ..., K-1].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from services.scheduler.policy.params import Mode, PolicyParams
from services.scheduler.policy.placement import Placement
from services.scheduler.policy.roles import Engine, Role
from services.scheduler.policy.staleness import StalenessRecord, mean_staleness
from services.scheduler.policy.supply import SupplyTimer


@dataclass(slots=True)
class PendingGroup:
    """A dispatched group not yet claimed by a training cell."""

    dispatch_version: int
    """v_d."""
    ready: bool = False
    packed_step: int | None = None
    """The batch the packer put it in, once packed."""


@dataclass(slots=True)
class PolicyState:
    roles: list[Role]
    placement: Placement
    dispatched: int = 0
    """d: executions dispatched (counted when the policy emits DispatchGroups)."""
    started: int = 0
    """p: executions started (counted when the policy emits StartExecutions)."""
    finished: int = 0
    """f: executions terminated, for any reason."""
    version: int = 0
    """Policy version v of the core's weights: optimizer steps taken."""
    published_version: int = 0
    """Version the rollout engines serve."""
    burst_start_version: int = 0
    """Version at which the current burst started; it ends at burst_start_version + μ."""
    burst: int = 0
    """Bursts completed (weight publications)."""
    run_started: bool = False
    pending_publications: list[int] = field(default_factory=list)
    """Versions sent to PublishWeights and not yet published, oldest first. While one is pending no
    cell joins, and its WeightsPublished brings the next boundary dispatch."""
    batch_step: int | None = None
    """Step of the open batch (None between StepCompleted and OpenBatch)."""
    batch_packed: int = 0
    batch_claimed: int = 0
    batch_stream_closed: bool = False
    batch_unclaimed: dict[str, None] = field(default_factory=dict)
    """Groups packed into the open batch that no cell has claimed yet (insertion-ordered)."""
    ready_unclaimed: int = 0
    """Ready groups no training cell has claimed (in the trajectory buffer or packed)."""
    groups: dict[str, PendingGroup] = field(default_factory=dict)
    staleness: list[StalenessRecord] = field(default_factory=list)
    supply: SupplyTimer = field(default_factory=SupplyTimer)
    microsteps_in_flight: int = 0
    transitions_completed: int = 0
    tick_at_s: float | None = None
    """Time of the last ScheduleTick emitted (so it is not emitted twice)."""
    now_s: float = 0.0
    members: list[int] = field(default_factory=list)
    """The cells that make up K, in membership order; members[0] is the core (see the module docstring)."""
    microsteps_by_cell: dict[int, int] = field(default_factory=dict)
    """Micro-steps in flight per training cell."""
    batch_cells: dict[int, dict[str, PendingGroup]] = field(default_factory=dict)
    """Cells that claimed a micro-step of the open batch (their gradients hold part of it), with the groups
    each claimed first: released with its micro-steps, they become claimable again."""
    leaving_core: int | None = None
    """A training core that got notice: it hands over at the next step boundary (or once it stops training)."""
    durable_version: int = 0
    """Newest version whose core state (weights and optimizer) is durable (CheckpointWritten)."""
    restore_from: int | None = None
    """A new core must restore the core state of this version (and replay up to `version`) before the next
    step; None when the core holds it."""
    restore_cell: int | None = None
    """The cell RestoreCore was sent to (None: not sent yet; it is sent once the core trains)."""
    steps_lost: int = 0
    """Optimizer steps a lost core had taken past its newest checkpoint, taken again by its successor."""
    cells_joined: int = 0
    cells_left: int = 0
    cells_lost: int = 0

    @classmethod
    def fresh(cls, params: PolicyParams) -> PolicyState:
        """Before RunStarted: every cell in rollout, nothing dispatched."""
        return cls(
            roles=[Role.ROLLOUT] * params.num_cells,
            placement=_placement(params),
            members=list(range(params.num_cells)),
        )

    @property
    def core(self) -> int | None:
        """The core cell (None while the pool has no member)."""
        return self.members[0] if self.members else None

    @property
    def next_cell(self) -> int:
        """The id a joining cell takes."""
        return len(self.roles)

    @classmethod
    def restore(
        cls,
        params: PolicyParams,
        *,
        dispatched: int,
        started: int,
        finished: int,
        roles: Sequence[Role],
        version: int,
        published_version: int,
        running: Mapping[str, Engine],
        groups: Mapping[str, PendingGroup] | None = None,
        burst: int = 0,
        now_s: float = 0.0,
    ) -> PolicyState:
        """Rebuild after a restart. The batch of step `version` is taken as open (the packer resumes it);
        `running` maps every running execution (p − f of them) to its engine; `groups` are the
        dispatched groups not yet claimed (ready or not)."""
        if len(roles) != params.num_cells:
            raise ValueError(f"roles must name all {params.num_cells} cells; got {len(roles)}")
        if not dispatched >= started >= finished >= 0:
            raise ValueError(
                f"counters must satisfy d >= p >= f >= 0; got d={dispatched} p={started} f={finished}"
            )
        if len(running) != started - finished:
            raise ValueError(
                f"running must list all p - f = {started - finished} executions; got {len(running)}"
            )
        if published_version > version:
            raise ValueError(f"published_version {published_version} is ahead of version {version}")
        placement = _placement(params)
        for cell, role in enumerate(roles):
            if role is not Role.ROLLOUT:
                placement.stop_serving(cell, [])
        placement.restore(running)
        groups = dict(groups or {})
        state = cls(
            roles=list(roles),
            placement=placement,
            dispatched=dispatched,
            started=started,
            finished=finished,
            version=version,
            published_version=published_version,
            burst_start_version=published_version,
            burst=burst,
            run_started=True,
            batch_step=version,
            ready_unclaimed=sum(1 for g in groups.values() if g.ready),
            groups=groups,
            now_s=now_s,
            members=list(range(params.num_cells)),
            durable_version=published_version,  # a lower bound until the core's next CheckpointWritten
        )
        for group_id, record in groups.items():
            if record.packed_step == version:
                state.batch_packed += 1
                state.batch_unclaimed[group_id] = None
        return state


def _placement(params: PolicyParams) -> Placement:
    return Placement(
        num_cells=params.num_cells,
        cell_capacity=params.cell_capacity,
        separate_pool_capacity=params.separate_pool_capacity,
    )


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """The control plane at one instant (what `gyre status` shows)."""

    now_s: float
    mode: Mode
    dispatched: int
    started: int
    finished: int
    queued: int
    running: int
    waterlevel: int
    rollout_capacity: int
    training_cells: int
    roles: tuple[Role, ...]
    engine_loads: dict[Engine, int]
    version: int
    published_version: int
    burst: int
    burst_start_version: int
    batch_step: int | None
    batch_packed: int
    batch_claimed: int
    ready_unclaimed: int
    claimable_groups: int
    supply_since_s: float | None
    consumed_groups: int
    mean_staleness: float | None
    transitions_completed: int
    num_cells: int
    """K now: the members of the pool."""
    members: tuple[int, ...]
    """Member cells in membership order; the first is the core."""
    cells_joining: int
    orphaned_executions: int
    """Running executions waiting for an engine (every serving cell was lost)."""
    durable_version: int
    steps_lost: int
    cells_joined: int
    cells_left: int
    cells_lost: int

    @classmethod
    def of(cls, state: PolicyState, params: PolicyParams, claimable: int) -> PolicySnapshot:
        return cls(
            now_s=state.now_s,
            mode=params.mode,
            dispatched=state.dispatched,
            started=state.started,
            finished=state.finished,
            queued=state.dispatched - state.started,
            running=state.started - state.finished,
            waterlevel=state.dispatched - state.finished,
            rollout_capacity=state.placement.rollout_capacity,
            training_cells=sum(1 for r in state.roles if r is Role.TRAINING),
            roles=tuple(state.roles),
            engine_loads=state.placement.loads(),
            version=state.version,
            published_version=state.published_version,
            burst=state.burst,
            burst_start_version=state.burst_start_version,
            batch_step=state.batch_step,
            batch_packed=state.batch_packed,
            batch_claimed=state.batch_claimed,
            ready_unclaimed=state.ready_unclaimed,
            claimable_groups=claimable,
            supply_since_s=state.supply.since_s,
            consumed_groups=len(state.staleness),
            mean_staleness=mean_staleness(state.staleness),
            transitions_completed=state.transitions_completed,
            num_cells=len(state.members),
            members=tuple(state.members),
            cells_joining=sum(1 for r in state.roles if r is Role.JOINING),
            orphaned_executions=state.placement.orphaned,
            durable_version=state.durable_version,
            steps_lost=state.steps_lost,
            cells_joined=state.cells_joined,
            cells_left=state.cells_left,
            cells_lost=state.cells_lost,
        )
