"""A hand-driven shell for policy tests: executes the policy's actions the way the service would.

Groups are named g0, g1, ... in dispatch order and their executions g0.0 ... g0.{N-1}; queued
executions start oldest first. `send` returns every action the event caused, follow-ups included.
Cells that join, leave or are lost are reported by name too (`join`, `cell_ready`, `leave`, `lose`);
the actions they cause are only recorded, like BeginTransition: the test reports their answers.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from services.scheduler.policy import (
    Action,
    BatchStreamClosed,
    BeginTransition,
    CellJoined,
    CellLeaving,
    CellLost,
    CellReady,
    CheckpointWritten,
    CoreRestored,
    DispatchGroups,
    Event,
    ExecutionStarted,
    ExecutionTerminated,
    GroupDispatched,
    GroupPacked,
    GroupReady,
    MicroStepClaimed,
    MicroStepDone,
    Policy,
    PolicyParams,
    RerouteExecutions,
    Role,
    RunStarted,
    StartExecutions,
    StepCompleted,
    Tick,
    TransitionCompleted,
    WeightsPublished,
)


class Scenario:
    def __init__(self, **params: Any) -> None:
        defaults: dict[str, Any] = {"tau_s": 0.0, "rho_min": 0.5}
        self.params = PolicyParams(**(defaults | params))
        self.policy = Policy(self.params)
        self.now = 0.0
        self.groups: list[str] = []
        self.queue: deque[str] = deque()
        self.engine: dict[str, int] = {}
        self.log: list[Action] = []

    def send(self, event: Event) -> list[Action]:
        caused: list[Action] = []
        pending: deque[Event] = deque([event])
        while pending:
            for action in self.policy.handle(pending.popleft()):
                caused.append(action)
                pending.extend(self._execute(action))
        self.log.extend(caused)
        return caused

    def _execute(self, action: Action) -> list[Event]:
        if isinstance(action, DispatchGroups):
            events: list[Event] = []
            for _ in range(action.num_groups):
                group = f"g{len(self.groups)}"
                self.groups.append(group)
                self.queue.extend(f"{group}.{j}" for j in range(action.group_size))
                events.append(GroupDispatched(self.now, group, action.group_size, action.policy_version))
            return events
        if isinstance(action, StartExecutions):
            started = [self.queue.popleft() for _ in range(action.count)]
            for execution in started:
                self.engine[execution] = action.engine
            return [ExecutionStarted(self.now, execution, action.engine) for execution in started]
        if isinstance(action, RerouteExecutions):
            for execution in action.execution_ids:
                assert self.engine[execution] == action.source
                self.engine[execution] = action.destination
        return []

    # --- events, by name ----------------------------------------------------------------------

    def at(self, now: float) -> Scenario:
        self.now = now
        return self

    def start(self) -> list[Action]:
        return self.send(RunStarted(self.now))

    def terminate(self, *executions: str) -> list[Action]:
        caused: list[Action] = []
        for execution in executions:
            caused += self.send(ExecutionTerminated(self.now, execution))
            del self.engine[execution]
        return caused

    def finish_group(self, group: str) -> list[Action]:
        """Terminate every member of `group` and report it ready."""
        members = [e for e in self.engine if e.startswith(group + ".")]
        return self.terminate(*members) + self.send(GroupReady(self.now, group))

    def ready(self, group: str) -> list[Action]:
        return self.send(GroupReady(self.now, group))

    def pack(self, group: str, step: int) -> list[Action]:
        return self.send(GroupPacked(self.now, group, step))

    def claim(self, cell: int, step: int, *groups: str) -> list[Action]:
        return self.send(MicroStepClaimed(self.now, cell, step, groups))

    def done(self, cell: int, step: int) -> list[Action]:
        return self.send(MicroStepDone(self.now, cell, step))

    def close(self, step: int, num_groups: int) -> list[Action]:
        return self.send(BatchStreamClosed(self.now, step, num_groups))

    def step(self, version: int) -> list[Action]:
        return self.send(StepCompleted(self.now, version))

    def transitioned(self, cell: int, role: Role) -> list[Action]:
        return self.send(TransitionCompleted(self.now, cell, role))

    def published(self, version: int) -> list[Action]:
        return self.send(WeightsPublished(self.now, version))

    def tick(self) -> list[Action]:
        return self.send(Tick(self.now))

    def join(self, cell: int) -> list[Action]:
        return self.send(CellJoined(self.now, cell))

    def cell_ready(self, cell: int, version: int) -> list[Action]:
        return self.send(CellReady(self.now, cell, version))

    def leave(self, cell: int) -> list[Action]:
        return self.send(CellLeaving(self.now, cell))

    def lose(self, cell: int) -> list[Action]:
        return self.send(CellLost(self.now, cell))

    def checkpoint(self, version: int) -> list[Action]:
        return self.send(CheckpointWritten(self.now, version))

    def restored(self, cell: int, version: int) -> list[Action]:
        return self.send(CoreRestored(self.now, cell, version))

    def train_batch(self, step: int, groups: list[str], cell: int = 0) -> list[Action]:
        """Pack, claim and finish `groups` as the batch of `step` on `cell`, then take the step."""
        for group in groups:
            self.pack(group, step)
        self.close(step, len(groups))
        for group in groups:
            self.claim(cell, step, group)
            self.done(cell, step)
        return self.step(step + 1)

    @property
    def snapshot(self) -> Any:
        return self.policy.snapshot()


def transitions(actions: list[Action]) -> list[tuple[int, Role]]:
    return [(a.cell, a.to_role) for a in actions if isinstance(a, BeginTransition)]


def starts(actions: list[Action]) -> list[tuple[int, int]]:
    return [(a.engine, a.count) for a in actions if isinstance(a, StartExecutions)]


def of_type(actions: list[Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]
