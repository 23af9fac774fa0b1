"""OpenAI Responses API ⇄ the internal message model (what the Codex CLI speaks).

`from_openai_responses(body, headers)` reads a `POST /v1/responses` body: `instructions` and
leading `system` / `developer` messages form the system prompt (Codex sends it as a developer
message); `input` is a string or a list of items — `message`, `reasoning`, `function_call`,
`custom_tool_call` and their `*_output` items. Consecutive assistant-side items (reasoning,
assistant messages, calls) form one assistant message, as they were one model turn; each call
output is one tool message. Images and files raise `RequestError`; unknown items are ignored.

`to_responses_output(output)` gives the `output` items of a non-streaming response.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from gyre.trajectory.api_common import (
    ItemRun,
    Items,
    Memoizer,
    MessageMemo,
    expect_dict,
    expect_list,
    get_int,
    get_number,
    get_str,
    lower_headers,
    parse_arguments,
    reject_media,
)
from gyre.trajectory.messages import (
    Api,
    Block,
    Message,
    ModelRequest,
    RequestError,
    RequestSampling,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    tool_results,
)
from gyre.trajectory.output import AssistantOutput

_MEDIA = {"input_image": "image", "input_file": "file", "input_audio": "audio"}
_ASSISTANT_ITEMS = frozenset(("reasoning", "function_call", "custom_tool_call"))
_OUTPUT_ITEMS = frozenset(("function_call_output", "custom_tool_call_output"))


def from_openai_responses(
    body: Mapping[str, Any], headers: Mapping[str, str] | None = None, memo: MessageMemo | None = None
) -> ModelRequest:
    """Convert an OpenAI Responses body; raises `RequestError` on malformed input. With the execution's
    `memo`, messages seen in its recent requests are not converted again."""
    body = expect_dict(body, "body")
    system: list[str] = []
    instructions = body.get("instructions")
    if instructions is not None:
        system.append(get_str(body, "instructions", ""))
    raw_input = body.get("input", [])
    items = (
        [{"type": "message", "role": "user", "content": raw_input}]
        if isinstance(raw_input, str)
        else raw_input
    )
    messages: list[Message] = []
    memoize = Memoizer(memo, Api.OPENAI_RESPONSES)
    turn = ItemRun(messages, memoize, _assistant_turn)
    results = ItemRun(messages, memoize, _tool_outputs)
    for i, item in enumerate(expect_list(items, "input")):
        field = f"input[{i}]"
        item = expect_dict(item, field)
        kind = _kind(item)
        if kind in _ASSISTANT_ITEMS or (kind == "message" and item.get("role") == "assistant"):
            results.end()
            turn.add(i, item)
            continue
        turn.end()
        if kind == "message":
            results.end()
            role = get_str(item, "role", field)
            if role in ("system", "developer"):
                if messages:
                    messages.append(memoize(item, functools.partial(_text_message, "system", item, field)))
                else:
                    system.append(_content_text(item.get("content"), f"{field}.content"))
            elif role == "user":
                messages.append(memoize(item, functools.partial(_text_message, "user", item, field)))
            else:
                raise RequestError(f"unknown role {role!r}", f"{field}.role")
        elif kind in _OUTPUT_ITEMS:
            results.add(i, item)
        elif kind is None:
            raise RequestError("input item has no type", field)
    turn.end()
    results.end()
    memoize.done()
    tools = tuple(
        _tool(t, f"tools[{i}]") for i, t in enumerate(expect_list(body.get("tools") or [], "tools"))
    )
    sampling = RequestSampling(
        max_tokens=get_int(body, "max_output_tokens"),
        temperature=get_number(body, "temperature"),
        top_p=get_number(body, "top_p"),
    )
    return ModelRequest(
        api=Api.OPENAI_RESPONSES,
        system=tuple(system),
        messages=tuple(messages),
        tools=tools,
        sampling=sampling,
        stream=bool(body.get("stream", False)),
        model=str(body.get("model") or ""),
        headers=lower_headers(headers),
        structured_output=_structured(body.get("text")),
    )


def to_responses_output(output: AssistantOutput) -> list[dict[str, Any]]:
    """`output` items of a non-streaming Responses object: reasoning, message, function calls."""
    items: list[dict[str, Any]] = []
    for block in output.blocks:
        if isinstance(block, ThinkingBlock):
            items.append(
                {
                    "type": "reasoning",
                    "id": "rs_" + _short(block.thinking),
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": block.thinking}],
                }
            )
        elif isinstance(block, TextBlock):
            if not block.text.strip():
                continue
            items.append(
                {
                    "type": "message",
                    "id": "msg_" + _short(block.text),
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": block.text, "annotations": []}],
                }
            )
        elif isinstance(block, ToolUseBlock):
            items.append(
                {
                    "type": "function_call",
                    "id": "fc_" + block.id,
                    "call_id": block.id,
                    "name": block.name,
                    "arguments": json.dumps(block.input, ensure_ascii=False),
                    "status": "completed",
                }
            )
    return items


def _short(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _text_message(role: Role, item: dict[str, Any], field: str) -> Message:
    return Message.text(role, _content_text(item.get("content"), f"{field}.content"))


def _kind(item: dict[str, Any]) -> str | None:
    """An input item's type (an item with a role and no type is a message)."""
    kind = item.get("type", "message" if "role" in item else None)
    return None if kind is None else str(kind)


def _assistant_turn(run: Items) -> Message:
    return Message(
        "assistant",
        tuple(b for i, item in run for b in _assistant_blocks(item, str(_kind(item)), f"input[{i}]")),
    )


def _tool_outputs(run: Items) -> Message:
    """One `tool` message from a run of tool outputs (`tool_results`)."""
    blocks: list[ToolResultBlock] = []
    for i, item in run:
        field = f"input[{i}]"
        output = item.get("output", "")
        text = output if isinstance(output, str) else _content_text(output, f"{field}.output")
        blocks.append(ToolResultBlock(get_str(item, "call_id", field), text))
    return tool_results(blocks)


def _assistant_blocks(item: dict[str, Any], kind: str, field: str) -> list[Block]:
    if kind == "reasoning":
        parts = [
            p.get("text", "")
            for p in expect_list(item.get("content") or [], f"{field}.content")
            if isinstance(p, dict)
        ]
        if not parts:
            summary = expect_list(item.get("summary") or [], f"{field}.summary")
            parts = [p.get("text", "") for p in summary if isinstance(p, dict)]
        return [ThinkingBlock("\n".join(str(p) for p in parts), str(item.get("encrypted_content") or ""))]
    if kind == "function_call":
        return [
            ToolUseBlock(
                get_str(item, "call_id", field),
                get_str(item, "name", field),
                parse_arguments(item.get("arguments")),
            )
        ]
    if kind == "custom_tool_call":
        return [
            ToolUseBlock(
                get_str(item, "call_id", field), get_str(item, "name", field), str(item.get("input", ""))
            )
        ]
    text = _content_text(item.get("content"), f"{field}.content")
    return [TextBlock(text)] if text else []


def _content_text(content: Any, field: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for i, part in enumerate(expect_list(content, field)):
        part = expect_dict(part, f"{field}[{i}]")
        kind = part.get("type")
        if kind in _MEDIA:
            raise reject_media(_MEDIA[str(kind)], f"{field}[{i}]")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            parts.append(get_str(part, "text", f"{field}[{i}]"))
        elif kind == "refusal":
            parts.append(get_str(part, "refusal", f"{field}[{i}]"))
    return "\n".join(parts)


def _tool(raw: Any, field: str) -> ToolSpec:
    raw = expect_dict(raw, field)
    kind = raw.get("type", "function")
    if kind == "function":
        return ToolSpec(
            get_str(raw, "name", field), str(raw.get("description") or ""), raw.get("parameters") or {}
        )
    name = raw.get("name") if isinstance(raw.get("name"), str) else str(kind)
    spec = {k: v for k, v in raw.items() if k not in ("name", "description")}
    return ToolSpec(str(name), str(raw.get("description") or ""), spec)


def _structured(text: Any) -> bool:
    fmt = text.get("format") if isinstance(text, dict) else None
    return isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object")
