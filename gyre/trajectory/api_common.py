"""Small validation helpers shared by the API converters (Anthropic, OpenAI Chat, Responses).

Each helper reads one field of a decoded JSON body and raises `RequestError` naming the field's
path when its type is wrong. Missing optional fields give the default; unknown fields are never
looked at, so harnesses may add new ones freely.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gyre.trajectory.messages import JSONValue, RequestError


def expect_dict(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RequestError(f"must be an object; got {type(value).__name__}", field)
    return value


def expect_list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise RequestError(f"must be an array; got {type(value).__name__}", field)
    return value


def get_str(obj: Mapping[str, Any], key: str, field: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if value is None:
        raise RequestError("is required", f"{field}.{key}" if field else key)
    if not isinstance(value, str):
        raise RequestError(
            f"must be a string; got {type(value).__name__}", f"{field}.{key}" if field else key
        )
    return value


def get_number(obj: Mapping[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"must be a number; got {type(value).__name__}", key)
    return float(value)


def get_int(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"must be an integer; got {type(value).__name__}", key)
    if value < 0:
        raise RequestError(f"must be non-negative; got {value}", key)
    return value


def get_stop(obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = obj.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise RequestError("must be a string or an array of strings", key)


def parse_arguments(arguments: Any) -> JSONValue:
    """Tool-call arguments as sent in OpenAI shapes: a JSON string (parsed when valid) or an object."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments if arguments is not None else {}


def lower_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {k.lower(): v for k, v in (headers or {}).items()}


def reject_media(kind: str, field: str) -> RequestError:
    return RequestError(f"{kind} content is not supported (text-only model); remove the {kind} block", field)
