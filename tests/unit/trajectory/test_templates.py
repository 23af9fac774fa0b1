"""Chat templates: the contract of every family's template, the demo model's compact ChatML layout,
and the Hugging Face adapter on a template and tokenizer built here (no hub download), checked
against transformers' own `apply_chat_template`."""

from __future__ import annotations

from typing import Any

import pytest

from gyre.model.families import FAMILIES
from gyre.model.tokenizer import Tokenizer
from gyre.trajectory import (
    Message,
    TemplateError,
    TextBlock,
    ThinkingBlock,
    ToolSpec,
    template_for_family,
)
from gyre.trajectory.messages import ToolResultBlock, ToolUseBlock
from gyre.trajectory.templates import ChatTemplate, HFChatTemplate

TOOLS = [
    ToolSpec("Bash", "Run a command.", {"type": "object", "properties": {"command": {"type": "string"}}})
]
CONVERSATION = [
    Message("user", (TextBlock("<system-reminder>x</system-reminder>"), TextBlock("do it"))),
    Message.text("system", "environment"),
    Message(
        "assistant",
        (ThinkingBlock("plan"), TextBlock("Running."), ToolUseBlock("c1", "Bash", {"command": "ls"})),
    ),
    Message(
        "user",
        (ToolResultBlock("c1", "a.txt"), ToolResultBlock("c2", "boom", is_error=True), TextBlock("and?")),
    ),
    Message("assistant", (TextBlock("Done."),)),
    Message("tool", (ToolResultBlock("c3", "late"),)),
]


def _build(name: str) -> ChatTemplate:
    """Every family's template (byte and BPE tokenizers), and a custom template built here."""
    if name == "custom":
        return _hf_template(CHATML)
    family, kind = name.split(":")
    return template_for_family(family, kind=kind)


@pytest.mark.parametrize("name", [f"{f}:{k}" for f in sorted(FAMILIES) for k in ("byte", "bpe")] + ["custom"])
def test_template_contract(name: str) -> None:
    template = _build(name)
    report = template.check_append_only("You are helpful.", TOOLS, CONVERSATION)
    assert report.ok, report.violations
    segments = template.render_segments("You are helpful.", TOOLS, CONVERSATION)
    assert [t for s in segments for t in s] == template.render_conversation(
        "You are helpful.", TOOLS, CONVERSATION, False
    )
    out = template.encode_output(CONVERSATION[2])
    assert out[-1] in template.stop_token_ids
    parsed = template.parse_output(out, b"s")
    reasoning = name == "custom" or FAMILIES[name.split(":")[0]].reasoning
    assert (
        parsed.thinking.strip() == ("plan" if reasoning else "")
        and parsed.text.strip() == "Running."
        and parsed.tool_calls[0].input == {"command": "ls"}
    )
    assert template.close_output(out[:-1])[:1] == out[-1:]


def test_embedded_layout_is_compact_chatml() -> None:
    t = template_for_family("chatml")
    system = t.render_system("Sys", TOOLS)
    assert system[0] == 257 and system[-1] == 258
    assert (
        bytes(system[1:-1]).decode()
        == 'system\nSys\n# Tools\n{"name":"Bash","description":"Run a command.","parameters":{"type":"object","properties":{"command":{"type":"string"}}}}'
    )
    seg = t.render_message(CONVERSATION[3])
    text = t.tokenizer.decode(seg)
    assert (
        text
        == "<|im_start|>tool\na.txt<|im_end|><|im_start|>tool error\nboom<|im_end|><|im_start|>user\nand?<|im_end|>"
    )
    assistant = t.tokenizer.decode(t.render_message(CONVERSATION[2]))
    assert assistant == (
        '<|im_start|>assistant\n<think>plan</think>Running.<tool_call>{"name":"Bash","arguments":{"command":"ls"}}'
        "</tool_call><|im_end|>"
    )
    emitted = ToolUseBlock(
        "c1", "Bash", {"command": "ls"}, raw='{"name": "Bash", "arguments": {"command": "ls"}}'
    )
    assert b'{"name": "Bash"' in bytes(
        i for i in t.encode_output(Message("assistant", (emitted,))) if i < 256
    )
    assert t.render_system("", []) == []


CHATML = """
{%- if tools %}{{- '<|im_start|>system\\n' + messages[0].content + '\\n# Tools\\n' }}
{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}
{%- if message.reasoning_content and (not strip_old or loop.index0 > ns.last_user) %}{{- '<think>' + message.reasoning_content + '</think>' }}{%- endif %}
{{- message.content }}
{%- for call in message.tool_calls or [] %}{{- '<tool_call>' + ({'name': call.function.name, 'arguments': call.function.arguments} | tojson) + '</tool_call>' }}{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
SET_NS = "{%- set ns = namespace(last_user=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
SPECIALS = [
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<|endoftext|>",
]


def _backend() -> Any:
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "You are helpful. Run a command. system user assistant tool do it environment Running. Done."
    ] * 20
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return tok


def _hf_template(template: str, strip_old: bool = False, strict: bool = True) -> HFChatTemplate:
    prefix = "{%- set strip_old = " + ("true" if strip_old else "false") + " %}" + SET_NS
    tokenizer = Tokenizer(_backend(), chat_template=prefix + template, named={"eos_token": "<|im_end|>"})
    return HFChatTemplate(tokenizer, end_of_turn="<|im_end|>", strict=strict)


def test_hf_segments_concatenate_to_transformers_apply_chat_template() -> None:
    from transformers import PreTrainedTokenizerFast

    t = _hf_template(CHATML)
    reference = PreTrainedTokenizerFast(tokenizer_object=_backend(), eos_token="<|im_end|>")
    conversation = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "do it"}]
    full = reference.apply_chat_template(conversation, tokenize=False, chat_template=t.chat_template)
    segments = t.render_segments("You are helpful.", [], [Message.text("user", "do it")])
    assert [i for s in segments for i in s] == reference.encode(full, add_special_tokens=False)
    assert t.tokenizer.decode(t.render_generation_prompt()) == "<|im_start|>assistant\n"
    out = t.encode_output(Message.text("assistant", "Done."))
    assert t.tokenizer.decode(out) == "Done.<|im_end|>"
    assert t.tokenizer.decode(t.close_output(out)) == "\n"
    assert t.tokenizer.decode(t.close_output(out[:-1])) == "<|im_end|>\n"


def test_hf_root_segments_are_kept_per_rendered_text_and_handed_out_as_copies() -> None:
    t = _hf_template(CHATML)
    encoded: list[str] = []
    encode = t.tokenizer.encode
    t.tokenizer.encode = lambda text: encoded.append(text) or encode(text)  # type: ignore[method-assign]
    first = t.render_system("You are helpful.", TOOLS)
    first.append(-1)  # a caller's list is its own
    assert t.render_system("You are helpful.", TOOLS) == first[:-1] and len(encoded) == 1
    assert t.render_system("You are helpful. Run a command.", TOOLS) != first[:-1] and len(encoded) == 2
    for i in range(40):  # bounded: the oldest roots leave
        t.render_system(f"system {i}", [])
    assert len(t._roots) <= 16
    t.render_system("You are helpful.", TOOLS)
    assert len(encoded) == 43


def test_hf_template_that_strips_earlier_thinking_is_refused() -> None:
    with pytest.raises(TemplateError, match="not append-only"):
        _hf_template(CHATML, strip_old=True)
    lenient = _hf_template(CHATML, strip_old=True, strict=False)
    assert not lenient.report.ok and any("rewrites earlier tokens" in v for v in lenient.report.violations)
