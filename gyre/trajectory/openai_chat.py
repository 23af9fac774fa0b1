"""OpenAI Chat Completions API ⇄ the internal message model.

`from_openai_chat(body, headers)` reads a `POST /v1/chat/completions` body: leading `system` /
`developer` messages become the system prompt, later ones stay messages; `user`, `assistant` (with
`tool_calls`, optional `reasoning_content`) and `tool` messages (one tool result each). Content is
a string or text parts; image/audio/file parts raise `RequestError`. Unknown fields are ignored.

`to_openai_chat_message(output)` / `openai_finish_reason(output)` give the non-streaming
`choices[0].message` and `finish_reason` of an engine output.
"""

from __future__ import annotations

import functools
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
    get_stop,
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

_MEDIA_PARTS = {"image_url": "image", "input_audio": "audio", "file": "file"}


def from_openai_chat(
    body: Mapping[str, Any], headers: Mapping[str, str] | None = None, memo: MessageMemo | None = None
) -> ModelRequest:
    """Convert an OpenAI Chat Completions body; raises `RequestError` on malformed input. With the
    execution's `memo`, messages seen in its recent requests are not converted again."""
    body = expect_dict(body, "body")
    raw = expect_list(body.get("messages"), "messages")
    system: list[str] = []
    messages: list[Message] = []
    memoize = Memoizer(memo, Api.OPENAI_CHAT)
    results = ItemRun(messages, memoize, _tool_results)
    for i, item in enumerate(raw):
        field = f"messages[{i}]"
        item = expect_dict(item, field)
        role = get_str(item, "role", field)
        if role in ("tool", "function"):
            results.add(i, item)
            continue
        results.end()
        if role in ("system", "developer"):
            if not messages:
                system.append(_content_text(item.get("content"), f"{field}.content"))
            else:
                messages.append(memoize(item, functools.partial(_text_message, "system", item, field)))
        elif role == "user":
            messages.append(memoize(item, functools.partial(_text_message, "user", item, field)))
        elif role == "assistant":
            messages.append(memoize(item, functools.partial(_assistant, item, field)))
        else:
            raise RequestError(f"unknown role {role!r}", f"{field}.role")
    results.end()
    memoize.done()
    tools = tuple(
        _tool(t, f"tools[{i}]") for i, t in enumerate(expect_list(body.get("tools") or [], "tools"))
    )
    max_tokens = get_int(body, "max_completion_tokens")
    sampling = RequestSampling(
        max_tokens=max_tokens if max_tokens is not None else get_int(body, "max_tokens"),
        temperature=get_number(body, "temperature"),
        top_p=get_number(body, "top_p"),
        stop=get_stop(body, "stop"),
    )
    return ModelRequest(
        api=Api.OPENAI_CHAT,
        system=tuple(system),
        messages=tuple(messages),
        tools=tools,
        sampling=sampling,
        stream=bool(body.get("stream", False)),
        model=str(body.get("model") or ""),
        headers=lower_headers(headers),
        structured_output=_structured(body.get("response_format")),
    )


def to_openai_chat_message(output: AssistantOutput) -> dict[str, Any]:
    """`choices[0].message` of a non-streaming response."""
    message: dict[str, Any] = {"role": "assistant", "content": output.text or None}
    if output.thinking:
        message["reasoning_content"] = output.thinking
    if output.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.input, ensure_ascii=False)},
            }
            for call in output.tool_calls
        ]
    return message


def openai_finish_reason(output: AssistantOutput) -> str:
    """`tool_calls`, `stop` or `length`."""
    return output.finish_reason


def _text_message(role: Role, item: dict[str, Any], field: str) -> Message:
    return Message.text(role, _content_text(item.get("content"), f"{field}.content"))


def _tool_results(run: Items) -> Message:
    """One `tool` message from a run of tool (or legacy function) results (`tool_results`)."""
    blocks: list[ToolResultBlock] = []
    for i, item in run:
        field = f"messages[{i}]"
        call_id = get_str(item, "tool_call_id" if item.get("role") == "tool" else "name", field)
        blocks.append(ToolResultBlock(call_id, _content_text(item.get("content"), f"{field}.content")))
    return tool_results(blocks)


def _assistant(item: dict[str, Any], field: str) -> Message:
    blocks: list[Block] = []
    reasoning = item.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        blocks.append(ThinkingBlock(reasoning))
    content = item.get("content")
    if content is not None:
        text = _content_text(content, f"{field}.content")
        if text:
            blocks.append(TextBlock(text))
    for j, call in enumerate(expect_list(item.get("tool_calls") or [], f"{field}.tool_calls")):
        cfield = f"{field}.tool_calls[{j}]"
        call = expect_dict(call, cfield)
        function = expect_dict(call.get("function"), f"{cfield}.function")
        blocks.append(
            ToolUseBlock(
                get_str(call, "id", cfield),
                get_str(function, "name", f"{cfield}.function"),
                parse_arguments(function.get("arguments")),
            )
        )
    return Message("assistant", tuple(blocks))


def _content_text(content: Any, field: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for i, part in enumerate(expect_list(content, field)):
        part = expect_dict(part, f"{field}[{i}]")
        kind = part.get("type")
        if kind in _MEDIA_PARTS:
            raise reject_media(_MEDIA_PARTS[str(kind)], f"{field}[{i}]")
        if kind in ("text", "input_text", "output_text"):
            parts.append(get_str(part, "text", f"{field}[{i}]"))
        elif kind == "refusal":
            parts.append(get_str(part, "refusal", f"{field}[{i}]"))
    return "\n".join(parts)


def _tool(raw: Any, field: str) -> ToolSpec:
    raw = expect_dict(raw, field)
    function = raw.get("function")
    if isinstance(function, dict):
        return ToolSpec(
            get_str(function, "name", f"{field}.function"),
            str(function.get("description") or ""),
            function.get("parameters") or {},
        )
    return ToolSpec(
        get_str(raw, "name", field), str(raw.get("description") or ""), raw.get("parameters") or {}
    )


def _structured(response_format: Any) -> bool:
    return isinstance(response_format, dict) and response_format.get("type") in ("json_schema", "json_object")
