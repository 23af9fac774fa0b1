"""Chat templates: the registry contract, the embedded layout, and the Hugging Face adapter on a
tokenizer built here (no hub download)."""

from __future__ import annotations

from typing import Any

import pytest

from gyre.trajectory import (
    TEMPLATES,
    Message,
    TemplateError,
    TextBlock,
    ThinkingBlock,
    ToolSpec,
    make_template,
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
    """Every registered template; `hf` needs a tokenizer, built here."""
    return _hf_template(CHATML) if name == "hf" else TEMPLATES[name]()


@pytest.mark.parametrize("name", sorted(TEMPLATES))
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
    assert (
        parsed.thinking == "plan"
        and parsed.text.strip() == "Running."
        and parsed.tool_calls[0].input == {"command": "ls"}
    )
    assert template.close_output(out[:-1])[:1] == out[-1:]


def test_embedded_layout_is_compact_chatml() -> None:
    t = make_template("embedded")
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
    with pytest.raises(ValueError, match="unknown chat template"):
        make_template("nope")


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


def _hf_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
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
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")


def _hf_template(template: str, strip_old: bool = False, strict: bool = True) -> HFChatTemplate:
    prefix = "{%- set strip_old = " + ("true" if strip_old else "false") + " %}" + SET_NS
    return HFChatTemplate(_hf_tokenizer(), "<|im_end|>", chat_template=prefix + template, strict=strict)


def test_hf_segments_concatenate_to_the_tokenized_full_render() -> None:
    t = _hf_template(CHATML)
    full_text = t.tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "do it"}],
        tokenize=False,
        chat_template=t.chat_template,
    )
    segments = t.render_segments("You are helpful.", [], [Message.text("user", "do it")])
    assert [i for s in segments for i in s] == t.tokenizer.encode(full_text, add_special_tokens=False)
    assert t.tokenizer.decode(t.render_generation_prompt()) == "<|im_start|>assistant\n"
    out = t.encode_output(Message.text("assistant", "Done."))
    assert t.tokenizer.decode(out) == "Done.<|im_end|>"
    assert t.tokenizer.decode(t.close_output(out)) == "\n"
    assert t.tokenizer.decode(t.close_output(out[:-1])) == "<|im_end|>\n"


def test_hf_template_that_strips_earlier_thinking_is_refused() -> None:
    with pytest.raises(TemplateError, match="not append-only"):
        _hf_template(CHATML, strip_old=True)
    lenient = _hf_template(CHATML, strip_old=True, strict=False)
    assert not lenient.report.ok and any("rewrites earlier tokens" in v for v in lenient.report.violations)
