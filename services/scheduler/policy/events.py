"""Events the scheduler policy consumes: facts reported by the shell (or the simulator).

Every event carries `now_s`, the time it happened on the driver's clock (wall clock in the service,
simulated clock in `sim/`). Events must arrive in non-decreasing time order. Each of the paper's
events corresponds to a message of protos/gyre/v1/events.proto, reduced to what the policy needs. The
last six describe a pool that changes while the run goes on (cells join, leave with notice, are lost;
the core's state becomes durable, a new core restores it); they have no wire message yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.policy.roles import Engine, Role


@dataclass(frozen=True, slots=True)
class RunStarted:
    """The run begins: the policy makes the first boundary dispatch and opens the first batch."""

    now_s: float


@dataclass(frozen=True, slots=True)
class GroupDispatched:
    """A group of executions the policy asked for is in the rollout queue."""

    now_s: float
    group_id: str
    num_executions: int
    policy_version: int
    """v_d: the published version when the group was admitted (from the DispatchGroups action)."""


@dataclass(frozen=True, slots=True)
class ExecutionStarted:
    """A queued execution started; its model calls go to `engine` (from a StartExecutions action)."""

    now_s: float
    execution_id: str
    engine: Engine


@dataclass(frozen=True, slots=True)
class ExecutionTerminated:
    """An execution ended for any reason (completed, failed, timed out, cancelled)."""

    now_s: float
    execution_id: str
    reason: str = "completed"


@dataclass(frozen=True, slots=True)
class GroupReady:
    """All N executions of a group are closed and resolved."""

    now_s: float
    group_id: str


@dataclass(frozen=True, slots=True)
class GroupPacked:
    """The packer took a ready group into the batch of optimizer step `step`."""

    now_s: float
    group_id: str
    step: int


@dataclass(frozen=True, slots=True)
class MicroStepClaimed:
    """A training cell claimed a micro-step of batch `step` holding rows of these groups."""

    now_s: float
    cell: int
    step: int
    group_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MicroStepDone:
    """A training cell finished a micro-step (its gradients are accumulated)."""

    now_s: float
    cell: int
    step: int


@dataclass(frozen=True, slots=True)
class BatchStreamClosed:
    """The packer enqueued every micro-step of batch `step` and closed its stream."""

    now_s: float
    step: int
    num_groups: int


@dataclass(frozen=True, slots=True)
class StepCompleted:
    """The core took the optimizer step that produced policy version `version`."""

    now_s: float
    version: int


@dataclass(frozen=True, slots=True)
class TransitionCompleted:
    """A cell finished its role transition and is now in `role` (ROLLOUT or TRAINING)."""

    now_s: float
    cell: int
    role: Role


@dataclass(frozen=True, slots=True)
class WeightsPublished:
    """Every rollout engine now serves policy version `version`."""

    now_s: float
    version: int


@dataclass(frozen=True, slots=True)
class Tick:
    """The clock advanced (a ScheduleTick came due, or the shell's periodic timer fired)."""

    now_s: float


@dataclass(frozen=True, slots=True)
class CellJoined:
    """A new cell entered the pool. It takes the next cell id (`PolicyState.next_cell`: ids are dense and
    never reused) and serves only once it holds current weights (LoadWeights → CellReady)."""

    now_s: float
    cell: int


@dataclass(frozen=True, slots=True)
class CellReady:
    """A joining cell's engine holds policy version `version` (the one its LoadWeights named)."""

    now_s: float
    cell: int
    version: int


@dataclass(frozen=True, slots=True)
class CellLeaving:
    """`cell` will leave the pool soon (a spot reclaim's notice, a node drained for maintenance): the
    policy lets it go gracefully and answers with RemoveCell once nothing depends on it."""

    now_s: float
    cell: int


@dataclass(frozen=True, slots=True)
class CellLost:
    """`cell` is gone for good, without notice (a node failed, or its notice ran out first)."""

    now_s: float
    cell: int


@dataclass(frozen=True, slots=True)
class CheckpointWritten:
    """The core's state after the step that produced `version` (weights and optimizer) is durable."""

    now_s: float
    version: int


@dataclass(frozen=True, slots=True)
class CoreRestored:
    """The new core `cell` holds the authoritative state of `version` (its RestoreCore is done)."""

    now_s: float
    cell: int
    version: int


Event = (
    RunStarted
    | GroupDispatched
    | ExecutionStarted
    | ExecutionTerminated
    | GroupReady
    | GroupPacked
    | MicroStepClaimed
    | MicroStepDone
    | BatchStreamClosed
    | StepCompleted
    | TransitionCompleted
    | WeightsPublished
    | Tick
    | CellJoined
    | CellReady
    | CellLeaving
    | CellLost
    | CheckpointWritten
    | CoreRestored
)
