"""The message model and the three API converters, both directions."""

from __future__ import annotations

import json

import pytest

from gyre.trajectory import (
    Api,
    RequestError,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    from_anthropic,
    from_openai_chat,
    from_openai_responses,
    template_for_family,
    to_anthropic_content,
    to_openai_chat_message,
    to_responses_output,
)
from gyre.trajectory.anthropic import anthropic_stop_reason
from gyre.trajectory.messages import Message
from gyre.trajectory.openai_chat import openai_finish_reason

ANTHROPIC = {
    "model": "claude",
    "max_tokens": 512,
    "temperature": 0.7,
    "stop_sequences": ["END"],
    "stream": True,
    "system": [
        {"type": "text", "text": "billing"},
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
    ],
    "tools": [{"name": "Bash", "description": "Run", "input_schema": {"type": "object"}}],
    "future_field": {"anything": 1},
    "messages": [
        {
            "role": "user",
            "content": [{"type": "text", "text": "reminder"}, {"type": "text", "text": "do it"}],
        },
        {"role": "system", "content": [{"type": "text", "text": "env"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "a.txt"}],
                    "is_error": True,
                },
                {"type": "brand_new_block", "x": 1},
            ],
        },
    ],
}


def test_from_anthropic_reads_every_block_kind() -> None:
    r = from_anthropic(ANTHROPIC, {"X-Claude-Code-Agent-Id": "a1"})
    assert r.api is Api.ANTHROPIC and r.stream and r.model == "claude"
    assert r.system == ("billing", "Be brief.")
    assert r.sampling.max_tokens == 512 and r.sampling.temperature == 0.7 and r.sampling.stop == ("END",)
    assert r.tools[0].name == "Bash" and r.headers == {"x-claude-code-agent-id": "a1"}
    assert [m.role for m in r.messages] == ["user", "system", "assistant", "user"]
    assert r.messages[2].blocks == (
        ThinkingBlock("hmm", "sig"),
        TextBlock("ok"),
        ToolUseBlock("t1", "Bash", {"command": "ls"}),
    )
    assert r.messages[3].blocks == (ToolResultBlock("t1", "a.txt", True),)


def test_transport_fields_and_content_shape_do_not_change_the_digest() -> None:
    a = from_anthropic({"messages": [{"role": "system", "content": [{"type": "text", "text": "env"}]}]})
    b = from_anthropic(
        {
            "messages": [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "env", "cache_control": {"type": "x"}}],
                }
            ]
        }
    )
    c = from_anthropic({"messages": [{"role": "system", "content": "env"}]})
    assert a.messages[0].digest == b.messages[0].digest == c.messages[0].digest
    assert a.messages[0].digest != Message.text("user", "env").digest
    assert Message.text("user", "a ").digest != Message.text("user", "a").digest


def test_assistant_digest_is_canonical_across_api_shapes() -> None:
    blocks = Message("assistant", (TextBlock("Sure.\n"), ToolUseBlock("c", "f", {"b": 1, "a": 2})))
    echoed = Message("assistant", (TextBlock("Sure."), ToolUseBlock("c", "f", {"a": 2, "b": 1})))
    assert blocks.digest == echoed.digest
    raw = Message(
        "assistant", (TextBlock("Sure."), ToolUseBlock("c", "f", {"a": 2, "b": 1}, raw='{"b":1,"a":2}'))
    )
    assert raw.digest != echoed.digest  # until restored, an echo differs from the emitted call
    assert (
        Message("assistant", (ThinkingBlock("t"), TextBlock("x"))).digest
        != Message.text("assistant", "x").digest
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "x", "content": [{"type": "image"}]}
                        ],
                    }
                ]
            },
            "messages[0].content[0].content[0]",
        ),
        ({"messages": "nope"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages[0].content[0]"),
        ({"messages": [], "max_tokens": "many"}, "max_tokens"),
    ],
)
def test_from_anthropic_rejects_with_a_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(RequestError) as err:
        from_anthropic(body)
    assert err.value.field == field


def test_from_openai_chat() -> None:
    body = {
        "model": "gpt",
        "max_completion_tokens": 64,
        "stop": "END",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "hm",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
            {"role": "system", "content": "late system"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "description": "F", "parameters": {"type": "object"}},
            }
        ],
    }
    r = from_openai_chat(body)
    assert r.system == ("Be brief.",) and r.sampling.max_tokens == 64 and r.sampling.stop == ("END",)
    assert [m.role for m in r.messages] == ["user", "assistant", "tool", "system"]
    assert r.messages[1].blocks == (ThinkingBlock("hm"), ToolUseBlock("c1", "f", {"a": 1}))
    assert r.messages[2].blocks == (ToolResultBlock("c1", "done"),)
    assert r.tools[0].parameters == {"type": "object"}
    with pytest.raises(RequestError, match="image"):
        from_openai_chat(
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
        )


def test_from_openai_responses_groups_one_model_turn() -> None:
    body = {
        "model": "codex",
        "instructions": "base",
        "max_output_tokens": 99,
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "dev prompt"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "plan"}],
                "encrypted_content": "e",
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Running."}],
            },
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd":"ls"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {"type": "web_search_call", "id": "w"},
        ],
        "tools": [
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "web_search"},
        ],
    }
    r = from_openai_responses(body)
    assert (
        r.api is Api.OPENAI_RESPONSES and r.system == ("base", "dev prompt") and r.sampling.max_tokens == 99
    )
    assert [m.role for m in r.messages] == ["user", "assistant", "tool"]
    assert r.messages[1].blocks == (
        ThinkingBlock("plan", "e"),
        TextBlock("Running."),
        ToolUseBlock("c1", "exec_command", {"cmd": "ls"}),
    )
    assert [t.name for t in r.tools] == ["exec_command", "web_search"]
    assert from_openai_responses({"input": "just text"}).messages == (Message.text("user", "just text"),)
    with pytest.raises(RequestError, match="image"):
        from_openai_responses(
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}
        )


def _output() -> object:
    ids = [
        261,
        *b"think",
        262,
        *b"Calling.",
        259,
        *json.dumps({"name": "f", "arguments": {"a": 1}}).encode(),
        260,
        258,
    ]
    return template_for_family("chatml").parse_output(ids, b"seed", "toolu_")


def test_outputs_to_each_api_and_back_match_the_output_digest() -> None:
    out = _output()
    content = to_anthropic_content(out)  # type: ignore[arg-type]
    assert [b["type"] for b in content] == ["thinking", "text", "tool_use"]
    assert anthropic_stop_reason(out) == "tool_use" and openai_finish_reason(out) == "tool_calls"  # type: ignore[arg-type]
    digest = out.to_message().digest  # type: ignore[attr-defined]
    # Echoes (before restoration) differ from the output only by the emitted raw payload.
    restored = {b.id: b for b in out.tool_calls}  # type: ignore[attr-defined]

    def restore(m: Message) -> Message:
        return m.replace_blocks(
            tuple(restored.get(b.id, b) if isinstance(b, ToolUseBlock) else b for b in m.blocks)
        )

    anthropic_echo = from_anthropic({"messages": [{"role": "assistant", "content": content}]}).messages[0]
    assert restore(anthropic_echo).digest == digest
    chat = to_openai_chat_message(out)  # type: ignore[arg-type]
    chat_echo = from_openai_chat({"messages": [{"role": "user", "content": "q"}, chat]}).messages[-1]
    assert restore(chat_echo).digest == digest
    items = to_responses_output(out)  # type: ignore[arg-type]
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    responses_echo = from_openai_responses({"input": [{"role": "user", "content": "q"}, *items]}).messages[-1]
    assert restore(responses_echo).digest == digest
