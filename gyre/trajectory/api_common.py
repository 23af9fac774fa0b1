"""Small validation helpers shared by the API converters (Anthropic, OpenAI Chat, Responses).

Each helper reads one field of a decoded JSON body and raises `RequestError` naming the field's
path when its type is wrong. Missing optional fields give the default; unknown fields are never
looked at, so harnesses may add new ones freely.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gyre.trajectory.messages import Api, JSONValue, Message, RequestError


class MessageMemo:
    """The messages of an execution's last two requests, by a digest of the raw JSON they came from.

    A harness resends its whole history on every call. Converting it again (a `Message` per item,
    each hashed) made the proxy's parsing grow with the history: 13–15 ms for an 800 KB Claude Code
    request, besides orjson's 1.2 ms. With a memo a converter builds only what it has not seen: a raw
    item is serialized (orjson) and hashed (SHA-256), ~2 µs per KB, and what it converted to last time is
    reused: 1.9 ms. Conversion is a function of the raw item and the API alone, so a hit is exactly what
    converting would give.

    An entry stays while one of the last two requests used it: memory is about one history's
    messages per execution, and two interleaved conversations (a subagent's calls between the main
    agent's) keep each other's entries. Not shared between executions: their histories differ."""

    __slots__ = ("_before_last", "_current", "_last")

    def __init__(self) -> None:
        self._current: dict[bytes, Message] = {}
        self._last: dict[bytes, Message] = {}
        self._before_last: dict[bytes, Message] = {}

    def __len__(self) -> int:
        return len(self._current.keys() | self._last.keys() | self._before_last.keys())

    def convert(self, api: Api, raw: Any, convert: Callable[[], Message]) -> Message:
        """What `convert()` gives for `raw` (JSON-decoded items of `api`'s requests), from the memo when
        seen recently. Keyed by the API too: the same JSON converts differently under another API."""
        try:
            # SHA-NI: ~3x blake2b's speed here
            key = hashlib.sha256(api.value.encode() + b"\0" + orjson.dumps(raw)).digest()
        except TypeError:  # what orjson refuses (integers beyond 64 bits): converted every time
            return convert()
        message = self._current.get(key) or self._last.get(key) or self._before_last.get(key) or convert()
        self._current[key] = message
        return message

    def end_request(self) -> None:
        """One request's conversion is done: entries none of the last two requests used go."""
        self._before_last, self._last, self._current = self._last, self._current, {}


class Memoizer:
    """One request's conversion through its execution's memo (None: everything converted):
    `memoize(raw, convert)` per message, `memoize.done()` once the request converted."""

    __slots__ = ("_api", "_memo")

    def __init__(self, memo: MessageMemo | None, api: Api) -> None:
        self._memo = memo
        self._api = api

    def __call__(self, raw: Any, convert: Callable[[], Message]) -> Message:
        return convert() if self._memo is None else self._memo.convert(self._api, raw, convert)

    def done(self) -> None:
        if self._memo is not None:
            self._memo.end_request()


Items = list[tuple[int, dict[str, Any]]]
"""Items of a request with their index (for the field paths of errors)."""


class ItemRun:
    """Consecutive items of a request that are ONE message — a run of tool results (`tool_results`), a
    model turn of several items — converted (and memoized) by the run's items when it ends."""

    __slots__ = ("_convert", "_items", "_memoize", "_messages")

    def __init__(
        self, messages: list[Message], memoize: Memoizer, convert: Callable[[Items], Message]
    ) -> None:
        self._messages = messages
        self._memoize = memoize
        self._convert = convert
        self._items: Items = []

    def add(self, index: int, item: dict[str, Any]) -> None:
        self._items.append((index, item))

    def end(self) -> None:
        """Add the run's message, if it has items, and start the next run."""
        if self._items:
            run, self._items = self._items, []
            self._messages.append(
                self._memoize([item for _, item in run], functools.partial(self._convert, run))
            )


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
