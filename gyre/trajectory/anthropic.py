"""Anthropic Messages API ⇄ the internal message model.

`from_anthropic(body, headers)` reads a `POST /v1/messages` body: `system` as a string or text
blocks, `messages` with string or block content (text, thinking with signature, redacted_thinking,
tool_use, tool_result with `is_error`), and `role: "system"` entries inside `messages` (Claude Code
sends them). Images and documents raise `RequestError`; unknown fields and block types are ignored.

`to_anthropic_content(output)` / `anthropic_stop_reason(output)` give the non-streaming response
shape of an engine output; the proxy frames them as SSE.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any

from gyre.trajectory.api_common import (
    Memoizer,
    MessageMemo,
    expect_dict,
    expect_list,
    get_int,
    get_number,
    get_stop,
    get_str,
    lower_headers,
    reject_media,
)
from gyre.trajectory.messages import (
    Api,
    Block,
    Message,
    ModelRequest,
    RequestError,
    RequestSampling,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre.trajectory.output import AssistantOutput

_MEDIA = frozenset(("image", "document", "file", "container_upload"))


def from_anthropic(
    body: Mapping[str, Any], headers: Mapping[str, str] | None = None, memo: MessageMemo | None = None
) -> ModelRequest:
    """Convert an Anthropic Messages request body; raises `RequestError` on malformed input. With the
    execution's `memo`, messages seen in its recent requests are not converted again."""
    body = expect_dict(body, "body")
    raw_messages = expect_list(body.get("messages"), "messages")
    memoize = Memoizer(memo, Api.ANTHROPIC)
    messages = tuple(
        memoize(m, functools.partial(_message, m, f"messages[{i}]")) for i, m in enumerate(raw_messages)
    )
    memoize.done()
    tools = tuple(
        _tool(t, f"tools[{i}]") for i, t in enumerate(expect_list(body.get("tools") or [], "tools"))
    )
    sampling = RequestSampling(
        max_tokens=get_int(body, "max_tokens"),
        temperature=get_number(body, "temperature"),
        top_p=get_number(body, "top_p"),
        top_k=get_int(body, "top_k"),
        stop=get_stop(body, "stop_sequences"),
    )
    return ModelRequest(
        api=Api.ANTHROPIC,
        system=_system(body.get("system")),
        messages=messages,
        tools=tools,
        sampling=sampling,
        stream=bool(body.get("stream", False)),
        model=str(body.get("model") or ""),
        structured_output=_structured(body),
        headers=lower_headers(headers),
    )


def message_from_anthropic(content: Any, role: str = "assistant", field: str = "content") -> Message:
    """One message from Anthropic content (e.g. a captured response's `content`)."""
    return _message({"role": role, "content": content}, field)


def to_anthropic_content(output: AssistantOutput) -> list[dict[str, Any]]:
    """Content blocks of a non-streaming Anthropic response for an engine output."""
    content: list[dict[str, Any]] = []
    for block in output.blocks:
        if isinstance(block, ThinkingBlock):
            content.append({"type": "thinking", "thinking": block.thinking, "signature": _signature(block)})
        elif isinstance(block, TextBlock):
            if block.text.strip():
                content.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolUseBlock):
            tool_input = block.input if isinstance(block.input, dict) else {"input": block.input}
            content.append({"type": "tool_use", "id": block.id, "name": block.name, "input": tool_input})
    return content


def anthropic_stop_reason(output: AssistantOutput) -> str:
    """`tool_use`, `end_turn` or `max_tokens`."""
    return {"tool_calls": "tool_use", "stop": "end_turn", "length": "max_tokens"}[output.finish_reason]


def _signature(block: ThinkingBlock) -> str:
    if block.signature:
        return block.signature
    return (
        "gyre-" + hashlib.blake2b(block.thinking.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    )


def _system(system: Any) -> tuple[str, ...]:
    if system is None:
        return ()
    if isinstance(system, str):
        return (system,) if system else ()
    blocks = expect_list(system, "system")
    texts: list[str] = []
    for i, block in enumerate(blocks):
        block = expect_dict(block, f"system[{i}]")
        kind = block.get("type", "text")
        if kind in _MEDIA:
            raise reject_media(kind, f"system[{i}]")
        if kind == "text":
            texts.append(get_str(block, "text", f"system[{i}]"))
    return tuple(texts)


def _message(raw: Any, field: str) -> Message:
    raw = expect_dict(raw, field)
    role = get_str(raw, "role", field)
    if role not in ("user", "assistant", "system"):
        raise RequestError(f"role must be user, assistant or system; got {role!r}", f"{field}.role")
    content = raw.get("content")
    if isinstance(content, str):
        return Message.text(role, content)  # type: ignore[arg-type]
    items = expect_list(content, f"{field}.content")
    blocks: list[Block] = []
    for j, item in enumerate(items):
        block = _block(expect_dict(item, f"{field}.content[{j}]"), f"{field}.content[{j}]")
        if block is not None:
            blocks.append(block)
    return Message(role, tuple(blocks))  # type: ignore[arg-type]


def _block(block: dict[str, Any], field: str) -> Block | None:
    kind = block.get("type")
    if kind == "text":
        return TextBlock(get_str(block, "text", field))
    if kind == "thinking":
        return ThinkingBlock(get_str(block, "thinking", field, ""), str(block.get("signature") or ""))
    if kind == "redacted_thinking":
        return ThinkingBlock("", str(block.get("data") or ""))
    if kind in ("tool_use", "server_tool_use"):
        tool_input = block.get("input", {})
        return ToolUseBlock(get_str(block, "id", field), get_str(block, "name", field), tool_input)
    if kind == "tool_result":
        return ToolResultBlock(
            get_str(block, "tool_use_id", field),
            _result_text(block.get("content"), f"{field}.content"),
            bool(block.get("is_error", False)),
        )
    if kind in _MEDIA:
        raise reject_media(str(kind), field)
    if kind is None:
        raise RequestError("content block has no type", field)
    return None


def _result_text(content: Any, field: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for i, item in enumerate(expect_list(content, field)):
        item = expect_dict(item, f"{field}[{i}]")
        kind = item.get("type")
        if kind in _MEDIA:
            raise reject_media(str(kind), f"{field}[{i}]")
        if kind == "text":
            parts.append(get_str(item, "text", f"{field}[{i}]"))
    return "\n".join(parts)


def _tool(raw: Any, field: str) -> ToolSpec:
    raw = expect_dict(raw, field)
    name = get_str(raw, "name", field)
    description = raw.get("description") or ""
    if not isinstance(description, str):
        raise RequestError("must be a string", f"{field}.description")
    return ToolSpec(name, description, raw.get("input_schema") or {})


def _structured(body: Mapping[str, Any]) -> bool:
    """A JSON-schema answer requested (`output_format`, or `output_config.format` of newer SDKs)."""
    config = body.get("output_config")
    return body.get("output_format") is not None or (
        isinstance(config, dict) and config.get("format") is not None
    )
