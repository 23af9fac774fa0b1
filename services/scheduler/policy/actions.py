"""Actions the scheduler policy emits: things the shell executes asynchronously.

Each action is answered later by events, never by a return value:

    DispatchGroups      → one GroupDispatched per group
    StartExecutions     → one ExecutionStarted per execution (naming the same engine)
    RerouteExecutions   → nothing (the proxy moves the executions' calls; their counters do not change)
    BeginTransition     → TransitionCompleted
    OpenBatch           → GroupPacked, MicroStepClaimed/Done, BatchStreamClosed, StepCompleted
    PublishWeights      → WeightsPublished
    ScheduleTick        → Tick at (or after) `at_s`
    LoadWeights         → CellReady
    ReleaseMicroSteps   → nothing (the packer re-queues them; other cells claim them again)
    RemoveCell          → nothing (the shell may stop the cell)
    RestoreCore         → CoreRestored
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.scheduler.policy.roles import Engine, Role


@dataclass(frozen=True, slots=True)
class DispatchGroups:
    """Admit `num_groups` new groups of `group_size` executions; their v_d is `policy_version`."""

    num_groups: int
    group_size: int
    policy_version: int
    first_group: int = field(default=0, compare=False)
    """Groups dispatched before these: the first new group is the `first_group`-th of the run (0-based),
    so a shell that executes the action twice (after a restart) writes the same groups."""


@dataclass(frozen=True, slots=True)
class StartExecutions:
    """Start `count` queued executions (oldest first) with their model calls routed to `engine`."""

    engine: Engine
    count: int
    first: int = field(default=0, compare=False)
    """Executions started before these: they are the `first`-th to `first + count − 1`-th dispatched
    executions (0-based, dispatch order), so starting them twice starts the same executions."""


@dataclass(frozen=True, slots=True)
class RerouteExecutions:
    """Move these running executions' model calls from `source` to `destination`."""

    source: Engine
    destination: Engine
    execution_ids: tuple[str, ...]
    recompute: bool = False
    """The source is gone (lost cell): no KV cache to migrate, the destination recomputes the prefix."""


@dataclass(frozen=True, slots=True)
class BeginTransition:
    """Move `cell` to `to_role` (ROLLOUT or TRAINING); its executions were rerouted first."""

    cell: int
    to_role: Role


@dataclass(frozen=True, slots=True)
class OpenBatch:
    """Open the stream of the batch that optimizer step `step` consumes (it produces version step + 1)."""

    step: int


@dataclass(frozen=True, slots=True)
class EndBurst:
    """The burst ended with policy version `version`: satellites leave the gradient group."""

    version: int


@dataclass(frozen=True, slots=True)
class PublishWeights:
    """The core publishes policy version `version` to every rollout engine."""

    version: int


@dataclass(frozen=True, slots=True)
class ScheduleTick:
    """Deliver a Tick at `at_s`: a timer of the policy (the supply check's τ) comes due then."""

    at_s: float


@dataclass(frozen=True, slots=True)
class LoadWeights:
    """Load policy version `version` into the engine of the joining `cell` (answered by CellReady)."""

    cell: int
    version: int


@dataclass(frozen=True, slots=True)
class ReleaseMicroSteps:
    """Every micro-step of batch `step` that `cell` claimed, in flight or done, goes back to the queue:
    the gradient it accumulated leaves with it (it left training before the step)."""

    cell: int
    step: int


@dataclass(frozen=True, slots=True)
class RemoveCell:
    """The policy no longer counts on `cell`: its executions were rerouted and its micro-steps released,
    so the shell may stop it (`lost`: it is already gone)."""

    cell: int
    lost: bool


@dataclass(frozen=True, slots=True)
class RestoreCore:
    """`cell` becomes the core: it loads the core state of `from_version` (handed over by a core that
    left with notice, or its newest checkpoint after a loss) and takes the steps from `from_version` to
    `version` again from their kept micro-steps (none after a hand-over). Answered by CoreRestored."""

    cell: int
    from_version: int
    version: int


Action = (
    DispatchGroups
    | StartExecutions
    | RerouteExecutions
    | BeginTransition
    | OpenBatch
    | EndBurst
    | PublishWeights
    | ScheduleTick
    | LoadWeights
    | ReleaseMicroSteps
    | RemoveCell
    | RestoreCore
)
