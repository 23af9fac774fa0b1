"""The scheduler's control-plane core: pure, deterministic, no I/O (no grpc, nats, redis or asyncio).

    from services.scheduler.policy import Policy, PolicyParams, RunStarted
    policy = Policy(PolicyParams(num_cells=8, group_size=16, batch_groups=32, phi=0.5, mu=3))
    actions = policy.handle(RunStarted(now_s=0.0))

Driven by the scheduler service (real events, wall clock) and by `sim/` (simulated clock). Modules:
params (the knobs and modes), events / actions (the vocabulary), ledger (Eq. 1–3), supply (the supply
check), reroute (destination order), placement (per-engine occupancy), staleness, state, persisted (the
state as JSON-able data, what a restarted scheduler resumes from), membership (role transitions and a
pool whose cells join, leave and are lost while the run goes on), policy.
"""

from services.scheduler.policy.actions import (
    Action,
    BeginTransition,
    DispatchGroups,
    EndBurst,
    LoadWeights,
    OpenBatch,
    PublishWeights,
    ReleaseMicroSteps,
    RemoveCell,
    RerouteExecutions,
    RestoreCore,
    ScheduleTick,
    StartExecutions,
)
from services.scheduler.policy.events import (
    BatchStreamClosed,
    CellJoined,
    CellLeaving,
    CellLost,
    CellReady,
    CheckpointWritten,
    CoreRestored,
    Event,
    ExecutionStarted,
    ExecutionTerminated,
    GroupDispatched,
    GroupPacked,
    GroupReady,
    MicroStepClaimed,
    MicroStepDone,
    RunStarted,
    StepCompleted,
    Tick,
    TransitionCompleted,
    WeightsPublished,
)
from services.scheduler.policy.params import Mode, PolicyParams
from services.scheduler.policy.persisted import state_from_dict, state_to_dict
from services.scheduler.policy.policy import Policy
from services.scheduler.policy.reroute import (
    destination_order,
    fill_destinations,
    reroute_destination,
    spread_destinations,
)
from services.scheduler.policy.roles import MEMBER_ROLES, SEPARATE_POOL, Engine, Role
from services.scheduler.policy.staleness import StalenessRecord, mean_staleness
from services.scheduler.policy.state import PendingGroup, PolicySnapshot, PolicyState

__all__ = [
    "MEMBER_ROLES",
    "SEPARATE_POOL",
    "Action",
    "BatchStreamClosed",
    "BeginTransition",
    "CellJoined",
    "CellLeaving",
    "CellLost",
    "CellReady",
    "CheckpointWritten",
    "CoreRestored",
    "DispatchGroups",
    "EndBurst",
    "Engine",
    "Event",
    "ExecutionStarted",
    "ExecutionTerminated",
    "GroupDispatched",
    "GroupPacked",
    "GroupReady",
    "LoadWeights",
    "MicroStepClaimed",
    "MicroStepDone",
    "Mode",
    "OpenBatch",
    "PendingGroup",
    "Policy",
    "PolicyParams",
    "PolicySnapshot",
    "PolicyState",
    "PublishWeights",
    "ReleaseMicroSteps",
    "RemoveCell",
    "RerouteExecutions",
    "RestoreCore",
    "Role",
    "RunStarted",
    "ScheduleTick",
    "StalenessRecord",
    "StartExecutions",
    "StepCompleted",
    "Tick",
    "TransitionCompleted",
    "WeightsPublished",
    "destination_order",
    "fill_destinations",
    "mean_staleness",
    "reroute_destination",
    "spread_destinations",
    "state_from_dict",
    "state_to_dict",
]
