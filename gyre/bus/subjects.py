"""Subjects and streams, declared in one place.

Subjects are `gyre.<run>.<area>.<event>`. Two streams per run: `GYRE_<run>_EVENTS` (limits
retention, every area but `cmd`) and `GYRE_<run>_COMMANDS` (work-queue retention: a command is
removed once one consumer acknowledges it). JetStream forbids overlapping subjects between
streams, hence the explicit area list.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from gyre.v1 import events_pb2 as ev

#: Event type → (area, event name). Add a new event here and in events.proto.
EVENT_ROUTES: dict[type[Message], tuple[str, str]] = {
    ev.GroupDispatched: ("group", "dispatched"),
    ev.GroupReady: ("group", "ready"),
    ev.ExecutionStarted: ("exec", "started"),
    ev.ExecutionTerminated: ("exec", "terminated"),
    ev.EvaluationDone: ("eval", "done"),
    ev.BatchOpened: ("batch", "opened"),
    ev.GroupPacked: ("batch", "group_packed"),
    ev.MicroStepEnqueued: ("batch", "microstep_enqueued"),
    ev.MicroStepClaimed: ("batch", "microstep_claimed"),
    ev.MicroStepDone: ("batch", "microstep_done"),
    ev.StreamClosed: ("batch", "stream_closed"),
    ev.RoleTransitionBegun: ("cell", "transition_begun"),
    ev.RoleTransitionCompleted: ("cell", "transition_completed"),
    ev.WeightsPublished: ("weights", "published"),
    ev.StepCompleted: ("train", "step_completed"),
    ev.ProcessExited: ("stack", "process_exited"),
}

#: Command type → (area, name); commands live on the work-queue stream.
COMMAND_ROUTES: dict[type[Message], tuple[str, str]] = {
    ev.ExecutionStartRequested: ("cmd", "exec_start"),
}

ROUTES: dict[type[Message], tuple[str, str]] = {**EVENT_ROUTES, **COMMAND_ROUTES}
EVENT_AREAS: tuple[str, ...] = tuple(sorted({area for area, _ in EVENT_ROUTES.values()}))


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A JetStream stream declaration."""

    name: str
    subjects: tuple[str, ...]
    work_queue: bool
    max_age_s: float = 7 * 24 * 3600.0


def subject_for(run_id: str, event_type: type[Message]) -> str:
    """The subject of an event or command type in a run."""
    try:
        area, name = ROUTES[event_type]
    except KeyError:
        raise ValueError(f"{event_type.__name__} has no subject; add it to gyre/bus/subjects.py") from None
    return f"gyre.{run_id}.{area}.{name}"


def event_stream(run_id: str) -> StreamSpec:
    return StreamSpec(
        name=f"GYRE_{run_id}_EVENTS",
        subjects=tuple(f"gyre.{run_id}.{area}.>" for area in EVENT_AREAS),
        work_queue=False,
    )


def command_stream(run_id: str) -> StreamSpec:
    return StreamSpec(name=f"GYRE_{run_id}_COMMANDS", subjects=(f"gyre.{run_id}.cmd.>",), work_queue=True)


def stream_of(run_id: str, event_type: type[Message]) -> StreamSpec:
    return command_stream(run_id) if event_type in COMMAND_ROUTES else event_stream(run_id)
