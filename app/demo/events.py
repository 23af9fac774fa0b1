"""Read every stored event of a run from JetStream (for reports after a run)."""

from __future__ import annotations

from dataclasses import dataclass

import nats
import nats.errors
from google.protobuf.message import Message
from nats.js.api import ConsumerConfig, DeliverPolicy

from gyre.bus.client import nats_auth
from gyre.bus.codec import TYPE_HEADER, decode_event
from gyre.bus.subjects import event_stream


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    subject: str
    time_s: float
    """Emission time (meta.emitted_at_ms) in seconds since the Unix epoch."""
    event: Message


async def read_events(url: str, run_id: str, idle_timeout_s: float = 1.0) -> list[RecordedEvent]:
    """Every event in the run's event stream, in stream order."""
    nc = await nats.connect(url, **nats_auth(None))  # type: ignore[arg-type]
    try:
        js = nc.jetstream()
        stream = event_stream(run_id).name
        info = await js.stream_info(stream)
        last = info.state.last_seq
        out: list[RecordedEvent] = []
        if last == 0:
            return out
        sub = await js.subscribe(
            f"gyre.{run_id}.>",
            stream=stream,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        while True:
            try:
                msg = await sub.next_msg(timeout=idle_timeout_s)
            except nats.errors.TimeoutError:
                break
            event = decode_event((msg.headers or {}).get(TYPE_HEADER, ""), msg.data)
            out.append(RecordedEvent(msg.subject, event.meta.emitted_at_ms / 1000.0, event))  # type: ignore[attr-defined]
            if msg.metadata.sequence.stream >= last:
                break
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()
