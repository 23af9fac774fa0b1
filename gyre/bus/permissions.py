"""Who may publish and subscribe to what on a run's NATS: one user per service, scoped to its subjects.

The local stack generates one NATS user per entry of `BUS_USERS` (app/stack/credentials.py) and gives
it `permissions(run_id, user)`: the event subjects it publishes, the JetStream API subjects of its own
durable consumers and of the run's two streams, acknowledgements of its own consumers, and replies on
its own inbox prefix (`_INBOX_<user>`, see `inbox_prefix`). Everything else is refused by nats-server.
The deploy shape gives the same permissions to each TLS identity's user (`CN=<identity>`, mapped from its
certificate; app/deploy/access.py writes deploy/nats/permissions.conf and `gyre tls init`'s).

Add a service's new event to its `publishes` here, or its publish is refused (nats-server logs a
"Permissions Violation"); tests/unit/bus/test_permissions.py checks the table against the services.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from gyre.bus.subjects import command_stream, event_stream, stream_of, subject_for
from gyre.v1 import events_pb2 as ev


@dataclass(frozen=True, slots=True)
class BusUse:
    """What one NATS user does on a run's bus."""

    publishes: tuple[type[Message], ...] = ()
    """Event and command types it publishes."""
    consumes: tuple[tuple[str, type[Message]], ...] = ()
    """(durable consumer name, one event type it reads: that type's stream holds the consumer)."""
    declares_streams: bool = True
    """It declares the run's streams at connect (`EventBus.ensure_streams`: info, create, update)."""
    reads_history: bool = False
    """It replays the event stream through ordered (ephemeral) consumers: reports, `gyre events tail`."""
    subscribes_live: bool = False
    """It subscribes to `gyre.<run>.>` with plain NATS (`gyre events tail`)."""


BUS_USERS: dict[str, BusUse] = {
    "scheduler": BusUse(
        publishes=(ev.GroupDispatched, ev.ExecutionStartRequested),
        consumes=(("scheduler", ev.ExecutionStarted),),
        reads_history=True,  # the per-step training metrics replay the stream (gyre/metrics/writer.py)
    ),
    "proxy": BusUse(),
    "runner": BusUse(
        publishes=(ev.ExecutionStarted, ev.ExecutionTerminated),
        consumes=(("runner", ev.ExecutionStartRequested),),
    ),
    "evaluator": BusUse(
        publishes=(ev.EvaluationDone, ev.GroupReady),
        consumes=(("evaluator", ev.ExecutionTerminated),),
    ),
    "packer": BusUse(
        publishes=(ev.BatchOpened, ev.GroupPacked, ev.MicroStepEnqueued, ev.StreamClosed),
        consumes=(("packer-archive", ev.StepCompleted),),  # a committed step's groups leave Redis
    ),
    "cell_agent": BusUse(
        publishes=(
            ev.RoleTransitionBegun,
            ev.RoleTransitionCompleted,
            ev.WeightsPublished,
            ev.StepCompleted,
            ev.MicroStepClaimed,
            ev.MicroStepDone,
        ),
    ),
    "supervisor": BusUse(publishes=(ev.ProcessExited,), declares_streams=False),
    "cli": BusUse(declares_streams=False, reads_history=True, subscribes_live=True),
}
"""NATS users of a run: the six services (all cell agents share `cell_agent`), the stack's supervisor,
and `cli` (reports, `gyre events tail`: read-only)."""


def inbox_prefix(user: str) -> str:
    """The reply-subject prefix a user's connection uses, so no user can read another's replies."""
    return f"_INBOX_{user}"


def permissions(run_id: str, user: str) -> dict[str, dict[str, list[str]]]:
    """nats-server `permissions` of `user` in run `run_id`: {"publish": {"allow": …}, "subscribe": {…}}."""
    try:
        use = BUS_USERS[user]
    except KeyError:
        raise ValueError(
            f"unknown NATS user {user!r}; add it to BUS_USERS in gyre/bus/permissions.py"
        ) from None
    api = "$JS.API"
    streams = (event_stream(run_id).name, command_stream(run_id).name)
    publish = [subject_for(run_id, t) for t in use.publishes]
    subscribe = [f"{inbox_prefix(user)}.>"]
    if use.declares_streams:
        publish += [f"{api}.STREAM.{op}.{s}" for s in streams for op in ("INFO", "CREATE", "UPDATE")]
    for durable, event_type in use.consumes:
        s = stream_of(run_id, event_type).name
        publish += [
            f"{api}.CONSUMER.INFO.{s}.{durable}",
            f"{api}.CONSUMER.CREATE.{s}.{durable}",
            f"{api}.CONSUMER.CREATE.{s}.{durable}.>",
            f"{api}.CONSUMER.DURABLE.CREATE.{s}.{durable}",
            f"{api}.CONSUMER.DELETE.{s}.{durable}",
            f"{api}.CONSUMER.MSG.NEXT.{s}.{durable}",
            f"$JS.ACK.{s}.{durable}.>",
        ]
    if use.reads_history:
        s = event_stream(run_id).name
        publish += [
            f"{api}.STREAM.INFO.{s}",
            f"{api}.CONSUMER.CREATE.{s}",
            f"{api}.CONSUMER.CREATE.{s}.>",
            f"{api}.CONSUMER.INFO.{s}.>",
            f"{api}.CONSUMER.DELETE.{s}.>",
            f"$JS.FC.{s}.>",
        ]
        subscribe.append("_INBOX.>")  # ordered consumers of a plain connection deliver to the default inbox
    if use.subscribes_live:
        subscribe.append(f"gyre.{run_id}.>")
    return {"publish": {"allow": sorted(set(publish))}, "subscribe": {"allow": sorted(set(subscribe))}}
