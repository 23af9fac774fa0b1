"""The internal message model: one representation of a model call for every harness-facing API.

The proxy converts Anthropic Messages, OpenAI Chat Completions and OpenAI Responses bodies into a
`ModelRequest` (see `anthropic.py`, `openai_chat.py`, `openai_responses.py`); the trajectory tree
matches and encodes `Message`s. Every message carries a stable `digest` of its canonical form,
computed once at construction, so matching a history costs one dictionary step per message.

Canonical form (what the digest covers):
- Transport-only fields (`cache_control`, citations, ids of API objects) are not part of the model,
  so they cannot change a digest; a string content and a single text block are the same message.
- Assistant messages are canonicalized across API shapes: thinking texts joined, text blocks
  stripped and joined (harnesses drop whitespace-only blocks and trim), then tool calls in order
  as (id, name, payload). The payload is the raw text the engine emitted when known, otherwise the
  arguments as sorted compact JSON: an echoed, re-serialized tool call therefore differs from the
  recorded one until the tree restores it (`restore.py`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, TypeAlias

import orjson

JSONValue: TypeAlias = Any
Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset(("system", "user", "assistant", "tool"))
DIGEST_SIZE = 16


class Api(StrEnum):
    """The harness-facing API a request came from."""

    ANTHROPIC = "anthropic"
    OPENAI_CHAT = "openai_chat"
    OPENAI_RESPONSES = "openai_responses"


class RequestError(ValueError):
    """A request is malformed or uses something the trajectory processor does not support.

    API-neutral: `field` is a dotted path into the request body (`messages[3].content[0]`); the
    proxy maps the error to the caller's own error body (Anthropic, OpenAI) with a 4xx status.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.reason = message


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingBlock:
    thinking: str
    signature: str = ""
    """Opaque to the model; echoed by Anthropic clients, not part of the digest."""


@dataclass(frozen=True, slots=True)
class ToolUseBlock:
    id: str
    name: str
    input: JSONValue
    """Parsed arguments (an object, or a string for free-form tools and unparsable arguments)."""
    raw: str | None = None
    """The exact payload the engine emitted for this call (e.g. the JSON inside
    `<tool_call>…</tool_call>`); None when the harness supplied the call."""

    def payload(self) -> str:
        """What identifies the call's content: the raw emission, else canonical JSON."""
        return self.raw if self.raw is not None else canonical_json(self.input)


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    tool_use_id: str
    content: str
    is_error: bool = False


Block: TypeAlias = TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a conversation; `digest` is the hash of its canonical form."""

    role: Role
    blocks: tuple[Block, ...]
    digest: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise RequestError(f"unknown role {self.role!r}; expected one of {sorted(ROLES)}", "role")
        object.__setattr__(self, "digest", _digest_form(canonical_form(self)))

    @classmethod
    def text(cls, role: Role, text: str) -> Message:
        return cls(role, (TextBlock(text),))

    def tool_uses(self) -> tuple[ToolUseBlock, ...]:
        return tuple(b for b in self.blocks if isinstance(b, ToolUseBlock))

    def text_content(self) -> str:
        """The text blocks joined by newlines."""
        return "\n".join(b.text for b in self.blocks if isinstance(b, TextBlock))

    def without_thinking(self) -> Message:
        return Message(self.role, tuple(b for b in self.blocks if not isinstance(b, ThinkingBlock)))

    def replace_blocks(self, blocks: tuple[Block, ...]) -> Message:
        return Message(self.role, blocks)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model: name, description and JSON-schema parameters."""

    name: str
    description: str = ""
    parameters: JSONValue = field(default_factory=dict)

    def canonical(self) -> list[Any]:
        return [self.name, self.description, self.parameters]


@dataclass(frozen=True, slots=True)
class RequestSampling:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model call as the harness sent it, in API-neutral form."""

    api: Api
    system: tuple[str, ...]
    """System prompt blocks in order (Anthropic `system`, leading system/developer messages,
    Responses `instructions`); harness profiles may drop volatile ones."""
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    sampling: RequestSampling = field(default_factory=RequestSampling)
    stream: bool = False
    model: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Request headers with lower-cased names (profiles classify on them)."""
    structured_output: bool = False
    """The call asks for a JSON-schema answer (Anthropic `output_format`/`output_config.format`, OpenAI
    `response_format`, Responses `text.format`): how harnesses make side calls such as session titles."""

    def with_messages(self, messages: tuple[Message, ...]) -> ModelRequest:
        return ModelRequest(
            self.api,
            self.system,
            messages,
            self.tools,
            self.sampling,
            self.stream,
            self.model,
            self.headers,
            self.structured_output,
        )


def tool_results(results: Sequence[ToolResultBlock]) -> Message:
    """A run of consecutive tool results as ONE `tool` message, as Anthropic's API sends them.

    OpenAI's APIs send one message (or item) per result; chat templates that group a run of results
    into one turn (Qwen's) then render each result only once the run is complete, so a message per
    result would not be append-only."""
    return Message("tool", tuple(results))


def canonical_json(value: JSONValue) -> str:
    """Compact JSON with sorted keys: the order-insensitive form of a tool input."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_form(message: Message) -> list[Any]:
    """The hashed form of a message (see the module docstring)."""
    if message.role == "assistant":
        thinking = "\n".join(b.thinking for b in message.blocks if isinstance(b, ThinkingBlock))
        texts = [b.text.strip() for b in message.blocks if isinstance(b, TextBlock)]
        calls = [[b.id, b.name, b.payload()] for b in message.blocks if isinstance(b, ToolUseBlock)]
        return ["assistant", thinking, "\n".join(t for t in texts if t), calls]
    blocks: list[Any] = []
    for b in message.blocks:
        if isinstance(b, TextBlock):
            blocks.append(["text", b.text])
        elif isinstance(b, ThinkingBlock):
            blocks.append(["thinking", b.thinking])
        elif isinstance(b, ToolUseBlock):
            blocks.append(["tool_use", b.id, b.name, b.payload()])
        else:
            blocks.append(["tool_result", b.tool_use_id, b.content, b.is_error])
    return [message.role, blocks]


def root_digest(system: str, tools: tuple[ToolSpec, ...]) -> bytes:
    """Key of a root child: the (volatile-free) system prompt and the tool definitions."""
    canonical = [t.canonical() for t in tools]
    try:  # orjson: ~10x faster than json on a harness's tool schemas (tens of KB, every call)
        tools_json = orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # what orjson refuses (ints beyond 64 bits): the same value always lands here
        tools_json = json.dumps(canonical, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return _digest_form(["root", system, tools_json])


def chain_digest(parent: bytes, digest: bytes) -> bytes:
    """Digest of a path: the parent path's digest extended by one node's digest."""
    return hashlib.blake2b(parent + digest, digest_size=DIGEST_SIZE).digest()


def _digest_form(form: list[Any]) -> bytes:
    """Hash a canonical form of strings, booleans and nested lists with length-prefixed framing
    (no JSON pass over large texts: a history is hashed at memory speed)."""
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    _feed(h, form)
    return h.digest()


def _feed(h: Any, item: Any) -> None:
    if isinstance(item, str):
        data = item.encode("utf-8", "surrogatepass")
        h.update(b"s" + len(data).to_bytes(8, "little"))
        h.update(data)
    elif isinstance(item, bool):
        h.update(b"t" if item else b"f")
    elif isinstance(item, list):
        h.update(b"l" + len(item).to_bytes(8, "little"))
        for x in item:
            _feed(h, x)
    else:
        raise TypeError(f"cannot hash {type(item).__name__} in a canonical form")
