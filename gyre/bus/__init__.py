"""The event bus: NATS JetStream behind a small interface.

Events are proto messages from `protos/gyre/v1/events.proto`, encoded as canonical proto3 JSON on
subjects `gyre.<run>.<area>.<event>`; commands (execution start requests) go to a work-queue stream.
"""

from gyre.bus.client import Delivery, EventBus, EventConsumer, login_url, nats_auth, watch_consumer
from gyre.bus.codec import decode_event, encode_event, event_type_name
from gyre.bus.subjects import StreamSpec, command_stream, event_stream, subject_for

__all__ = [
    "Delivery",
    "EventBus",
    "EventConsumer",
    "StreamSpec",
    "command_stream",
    "decode_event",
    "encode_event",
    "event_stream",
    "event_type_name",
    "login_url",
    "nats_auth",
    "subject_for",
    "watch_consumer",
]
