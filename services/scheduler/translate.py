"""Bus events → policy events, for the scheduler's driver.

Protobuf events from NATS become the pure policy's event types. The few facts the policy does not
keep live in the shell's `ShellState` (persisted with the policy): starts commanded but not yet
confirmed (the executor records them), each open batch's mean reward until its step completes (for
`GetState`), and the groups of each enqueued micro-step.

A satellite's cell agent that the stack's supervisor gave up on (`ProcessExited` with `gave_up`, process
`cell_agent-K`, K > 0) is lost for good: `CellLost(K)`. The core's (cell 0) stops the run instead, and an
exit followed by a restart changes nothing here.

Each policy event is made by a `MakeEvent` closure that the driver calls inside its serialized
apply, so a closure that reads or changes `commanded` sees the executor's writes in action order —
a runner can report a start while the executor is still recording the command.
"""

from __future__ import annotations

from google.protobuf.message import Message

from gyre.ids import step_of_batch
from gyre.log import get_logger
from gyre.v1 import common_pb2
from gyre.v1 import events_pb2 as ev
from services.scheduler.driver import MakeEvent
from services.scheduler.mismatch_gate import MismatchGate
from services.scheduler.naming import engine_index
from services.scheduler.persist import ShellState
from services.scheduler.policy import (
    BatchStreamClosed,
    CellLost,
    ExecutionStarted,
    ExecutionTerminated,
    GroupPacked,
    GroupReady,
    MicroStepClaimed,
    MicroStepDone,
    StepCompleted,
)

log = get_logger("gyre.scheduler.translate")

CONSUMED: tuple[type[Message], ...] = (
    ev.ExecutionStarted,
    ev.ExecutionTerminated,
    ev.GroupReady,
    ev.GroupPacked,
    ev.MicroStepEnqueued,
    ev.MicroStepClaimed,
    ev.MicroStepDone,
    ev.StreamClosed,
    ev.StepCompleted,
    ev.ProcessExited,
)

_CELL_AGENT = "cell_agent-"


class EventTranslator:
    def __init__(self, shell: ShellState, gate: MismatchGate | None = None) -> None:
        self.shell = shell
        self.gate = gate
        """Checks each completed step's train/inference mismatch; None = no gate."""
        self.commanded = shell.commanded
        """Execution id → engine, for starts commanded and not yet confirmed (the executor's dict)."""

    @property
    def last_step_reward(self) -> float:
        return self.shell.last_step_reward

    def translate(self, e: Message) -> list[MakeEvent]:
        """The policy events one bus event makes (none for bookkeeping-only events)."""
        match e:
            # `commanded` is read and changed inside the closures (the driver's serialized apply).
            case ev.ExecutionStarted():
                eid, engine = e.execution.execution_id, engine_index(e.engine_id)

                def confirmed(now: float) -> ExecutionStarted:
                    # The engine the policy placed it on: a start commanded twice (by a scheduler that
                    # restarted mid-action) may name another engine than the command the runner ran.
                    return ExecutionStarted(now, eid, self.commanded.pop(eid, engine))

                return [confirmed]
            case ev.ExecutionTerminated():
                eid = e.execution.execution_id
                reason = common_pb2.TerminationReason.Name(e.reason)

                def never_started(now: float) -> ExecutionStarted | None:
                    # terminated before it could report a start (an infra failure at start)
                    return (
                        ExecutionStarted(now, eid, self.commanded.pop(eid)) if eid in self.commanded else None
                    )

                return [never_started, lambda now: ExecutionTerminated(now, eid, reason)]
            case ev.GroupReady():
                gid = e.group_id
                return [lambda now: GroupReady(now, gid)]
            case ev.GroupPacked():
                gid, step = e.group_id, step_of_batch(e.batch_id)
                return [lambda now: GroupPacked(now, gid, step)]
            case ev.MicroStepEnqueued():
                self.shell.microstep_groups[e.microstep_id] = list(e.group_ids)
                return []
            case ev.MicroStepClaimed():
                groups = tuple(e.group_ids) or tuple(self.shell.microstep_groups.get(e.microstep_id, ()))
                cell, step = e.cell, int(e.step)
                return [lambda now: MicroStepClaimed(now, cell, step, groups)]
            case ev.MicroStepDone():
                cell, step = e.cell, int(e.step)
                self.shell.microstep_groups.pop(e.microstep_id, None)
                return [lambda now: MicroStepDone(now, cell, step)]
            case ev.StreamClosed():
                step, num = step_of_batch(e.batch_id), e.num_groups
                self.shell.batch_reward[step] = e.mean_reward
                return [lambda now: BatchStreamClosed(now, step, num)]
            case ev.StepCompleted():
                version = e.policy_version
                reward = self.shell.batch_reward.pop(version - 1, None)
                if reward is not None:
                    self.shell.last_step_reward = reward
                self._check_mismatch(e)
                return [lambda now: StepCompleted(now, version)]
            case ev.ProcessExited():
                lost = lost_satellite(e)
                if lost is None:
                    return []
                log.warning("cell_lost", cell=lost, process=e.process, reason=e.reason)
                return [lambda now: CellLost(now, lost)]
        return []

    def _check_mismatch(self, e: ev.StepCompleted) -> None:
        """Feed the step's mismatch to the gate; on `stop` the run ends like at `max_steps`, with the reason kept."""
        if self.gate is None or e.replayed:  # a replayed step was reported (and gated) once already
            return
        step = int(e.policy_version) - 1
        reason = self.gate.observe(step=step, mismatch_kl=e.mismatch_kl, measured=e.num_mismatch_targets > 0)
        if reason is None:
            return
        if self.gate.section.action == "stop" and not self.shell.stopping:
            self.shell.stopping = True
            self.shell.stop_reason = reason
            log.error("run_stopped_by_mismatch_gate", step=step, reason=reason)
        else:
            log.warning("mismatch_over_bound", step=step, reason=reason)


def lost_satellite(e: ev.ProcessExited) -> int | None:
    """The satellite cell a `ProcessExited` reports lost for good (its agent out of restarts), else None."""
    index = e.process.removeprefix(_CELL_AGENT)
    if not e.gave_up or index == e.process or not index.isdigit() or int(index) == 0:
        return None
    return int(index)
