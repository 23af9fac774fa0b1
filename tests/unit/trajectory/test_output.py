"""Tool-call parsers (registry contract) and output parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.trajectory import PARSERS, TextBlock, ThinkingBlock, template_for_family
from gyre.trajectory.output import ParsedCall, tool_call_id


@pytest.mark.parametrize("name", sorted(PARSERS))
@given(text=st.text(alphabet=st.sampled_from(list('ab{}":,[] <>/_toolcahink\n')), max_size=80))
def test_parser_contract_never_raises_and_keeps_text(name: str, text: str) -> None:
    blocks = PARSERS[name]().parse(text)
    for block in blocks:
        assert isinstance(block, TextBlock | ThinkingBlock | ParsedCall)
    if "<tool_call>" not in text and "</think>" not in text:
        assert "".join(b.text for b in blocks if isinstance(b, TextBlock)) == text


def test_hermes_parses_thinking_text_and_calls_in_order() -> None:
    text = '<think>plan</think>Let me run.\n<tool_call>{"name": "Bash", "arguments": {"command": "ls"}}</tool_call>'
    blocks = PARSERS["hermes"]().parse(
        text + '<tool_call>{"name":"Read","arguments":"{\\"path\\": \\"a\\"}"}</tool_call>'
    )
    assert blocks[0] == ThinkingBlock("plan")
    assert blocks[1] == TextBlock("Let me run.\n")
    assert blocks[2] == ParsedCall(
        "Bash", {"command": "ls"}, '{"name": "Bash", "arguments": {"command": "ls"}}'
    )
    assert isinstance(blocks[3], ParsedCall) and blocks[3].arguments == {"path": "a"}


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>["x"]</tool_call>',
        '<tool_call>{"name": "f", "arguments": 3}</tool_call>',
        '<tool_call>{"name": "f"',
    ],
)
def test_malformed_tool_calls_stay_text(bad: str) -> None:
    blocks = PARSERS["hermes"]().parse("before " + bad)
    assert blocks == [TextBlock("before " + bad)]


def test_parse_output_ids_are_deterministic_and_finish_reasons() -> None:
    template = template_for_family("chatml")
    call = [259, *b'{"name": "f", "arguments": {}}', 260]
    two_calls = template.parse_output([*call, *call, 258], b"seed")
    ids = [c.id for c in two_calls.tool_calls]
    assert len(set(ids)) == 2 and ids[0] == tool_call_id(b"seed", 0, '{"name": "f", "arguments": {}}')
    assert template.parse_output([*call, *call, 258], b"seed").tool_calls == two_calls.tool_calls
    assert template.parse_output([*call, 258], b"other").tool_calls[0].id != ids[0]
    assert two_calls.finish_reason == "tool_calls"
    assert template.parse_output([*b"hi", 258], b"").finish_reason == "stop"
    cut = template.parse_output([*b"hi", 259, *b'{"name"'], b"")
    assert cut.finish_reason == "length" and cut.text == 'hi<tool_call>{"name"'
