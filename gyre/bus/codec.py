"""Event codec: canonical proto3 JSON bodies plus a `Gyre-Type` header naming the message."""

from __future__ import annotations

from google.protobuf import json_format
from google.protobuf.message import Message

from gyre.bus.subjects import ROUTES

TYPE_HEADER = "Gyre-Type"

_BY_NAME: dict[str, type[Message]] = {t.DESCRIPTOR.full_name: t for t in ROUTES}


def event_type_name(event: Message | type[Message]) -> str:
    return event.DESCRIPTOR.full_name


def encode_event(event: Message) -> bytes:
    """Canonical proto3 JSON (lowerCamelCase names, defaults omitted), compact."""
    return json_format.MessageToJson(event, indent=None).encode()


def decode_event(type_name: str, body: bytes) -> Message:
    """Decode a body by its type header; unknown fields are ignored (newer producers)."""
    try:
        cls = _BY_NAME[type_name]
    except KeyError:
        raise ValueError(f"unknown event type {type_name!r}") from None
    return json_format.Parse(body, cls(), ignore_unknown_fields=True)
