"""`MessageMemo`: a harness resends its whole history on every call; with the execution's memo a converter
builds only the messages it has not seen, and what it reuses is exactly what converting would give."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gyre.trajectory import (
    MessageMemo,
    ModelRequest,
    RequestError,
    from_anthropic,
    from_openai_chat,
    from_openai_responses,
)

Convert = Callable[..., ModelRequest]


def _anthropic_turn(n: int) -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": f"plan {n}", "signature": "s"},
                {"type": "text", "text": f"step {n}"},
                {"type": "tool_use", "id": f"t{n}", "name": "Bash", "input": {"command": f"ls {n}"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": f"out {n}"}]},
    ]


def _chat_turn(n: int) -> list[dict[str, Any]]:
    calls = [
        {"id": f"c{n}{k}", "type": "function", "function": {"name": "f", "arguments": f'{{"k": {k}}}'}}
        for k in range(2)
    ]
    return [
        {"role": "assistant", "content": f"step {n}", "tool_calls": calls},
        {"role": "tool", "tool_call_id": f"c{n}0", "content": f"out {n}.0"},
        {"role": "tool", "tool_call_id": f"c{n}1", "content": f"out {n}.1"},
    ]


def _responses_turn(n: int) -> list[dict[str, Any]]:
    return [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": f"plan {n}"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"step {n}"}]},
        {"type": "function_call", "call_id": f"c{n}", "name": "exec", "arguments": f'{{"n": {n}}}'},
        {"type": "web_search_call", "id": f"w{n}"},
        {"type": "function_call_output", "call_id": f"c{n}", "output": f"out {n}"},
    ]


APIS: dict[str, tuple[Convert, str, list[dict[str, Any]], Callable[[int], list[dict[str, Any]]]]] = {
    "anthropic": (
        from_anthropic,
        "messages",
        [{"role": "user", "content": "fix the bug"}],
        _anthropic_turn,
    ),
    "openai_chat": (
        from_openai_chat,
        "messages",
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "fix the bug"}],
        _chat_turn,
    ),
    "openai_responses": (
        from_openai_responses,
        "input",
        [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]}],
        _responses_turn,
    ),
}


def _histories(api: str, turns: int) -> list[list[dict[str, Any]]]:
    """The item lists of a conversation's calls: each adds a turn, and every other call first arrives
    with its last item missing (a tool run or an assistant turn that grows between two requests)."""
    _, _, first, turn = APIS[api]
    items, out = copy.deepcopy(first), []
    for n in range(turns):
        new = turn(n)
        if n % 2:
            out.append(copy.deepcopy(items + new[:-1]))
        items = items + new
        out.append(copy.deepcopy(items))
    return out


@pytest.mark.parametrize("api", sorted(APIS))
def test_a_memoized_conversion_is_the_plain_one_and_reuses_what_it_saw(api: str) -> None:
    convert, field, _, _ = APIS[api]
    memo = MessageMemo()
    previous: ModelRequest | None = None
    for items in _histories(api, 6):
        plain = convert({field: copy.deepcopy(items)})
        memoized = convert({field: items}, None, memo)
        assert memoized == plain
        assert [m.digest for m in memoized.messages] == [m.digest for m in plain.messages]
        if previous is not None:  # everything before the newest messages is the object converted before
            kept = [m for m in memoized.messages if any(m is p for p in previous.messages)]
            assert len(kept) >= len(memoized.messages) - 3, (len(kept), len(memoized.messages))
        previous = memoized


def test_the_memo_keeps_what_the_last_two_requests_used() -> None:
    memo = MessageMemo()
    bodies = [
        {"messages": [{"role": "user", "content": f"task {k}-{i}"} for i in range(5)]} for k in range(3)
    ]
    first = from_anthropic(bodies[0], None, memo)
    assert len(memo) == 5
    from_anthropic(bodies[1], None, memo)
    assert len(memo) == 10
    from_anthropic(bodies[2], None, memo)
    assert len(memo) == 10  # the first request's messages are gone
    again = from_anthropic(bodies[0], None, memo)
    assert again == first and not any(a is b for a, b in zip(again.messages, first.messages, strict=True))


@pytest.mark.parametrize("api", sorted(APIS))
def test_a_malformed_item_fails_every_time_and_leaves_the_memo_usable(api: str) -> None:
    convert, field, first, _ = APIS[api]
    memo = MessageMemo()
    good = convert({field: copy.deepcopy(first)}, None, memo)
    bad = {field: [*copy.deepcopy(first), {"role": "robot", "content": "x"}]}
    for _ in range(2):
        with pytest.raises(RequestError, match="role"):
            convert(copy.deepcopy(bad), None, memo)
    assert convert({field: copy.deepcopy(first)}, None, memo) == good


def test_items_orjson_cannot_serialize_are_converted_without_the_memo() -> None:
    memo = MessageMemo()
    body = {
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"big": 2**70}}],
            },
        ]
    }
    assert from_anthropic(copy.deepcopy(body), None, memo) == from_anthropic(copy.deepcopy(body))
    assert len(memo) == 1


def test_the_same_json_under_another_api_is_converted_for_that_api() -> None:
    """Anthropic keeps a user turn's text parts as blocks; OpenAI Chat reads them as one text. A harness
    that calls one execution through both APIs must get each API's own conversion from the memo."""
    item = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    memo = MessageMemo()
    anthropic = from_anthropic({"messages": [copy.deepcopy(item)]}, None, memo).messages[0]
    chat = from_openai_chat({"messages": [copy.deepcopy(item)]}, None, memo).messages[0]
    assert anthropic == from_anthropic({"messages": [copy.deepcopy(item)]}).messages[0]
    assert chat == from_openai_chat({"messages": [copy.deepcopy(item)]}).messages[0]
    assert anthropic.digest != chat.digest
