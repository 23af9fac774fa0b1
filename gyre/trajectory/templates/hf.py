"""The `hf` chat template: an adapter over a Hugging Face tokenizer with a Jinja chat template.

Used when the rollout engine serves a real model (SGLang). Rendering goes through the tokenizer's
own `apply_chat_template` (Jinja), so the recorded prompt is what the model was trained to read.
A message's segment is the text its render appends to a short, fixed context (a stand-in system
turn and the previous message), tokenized on its own — cost proportional to the message, not to
the history. That is only correct for append-only templates whose segments tokenize
independently, so the constructor probes the template with a conversation that has thinking, a
tool call and a tool result and raises `TemplateError` when `check_append_only` finds a violation
(typical culprit: templates that drop the thinking of earlier turns). Pass `strict=False` to keep
a non-append-only template anyway; `report` then says what breaks.

    tokenizer = transformers.AutoTokenizer.from_pretrained("/models/qwen")   # a local directory
    template = HFChatTemplate(tokenizer, end_of_turn="<|im_end|>")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gyre.trajectory.messages import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre.trajectory.templates.base import AppendOnlyReport, ChatTemplate, TemplateError


class HFTokenizer(Protocol):
    """The part of a `transformers` tokenizer the adapter uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = ...) -> str: ...

    def convert_tokens_to_ids(self, tokens: Any) -> Any: ...


_STUB = "S"


class HFChatTemplate(ChatTemplate):
    """Per-message segments of a Jinja chat template (see the module docstring)."""

    name = "hf"

    def __init__(
        self,
        tokenizer: HFTokenizer,
        end_of_turn: str,
        tool_call_parser: str = "hermes",
        chat_template: str | None = None,
        strict: bool = True,
    ) -> None:
        super().__init__(tool_call_parser)
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.end_of_turn = end_of_turn
        eot_id = tokenizer.convert_tokens_to_ids(end_of_turn)
        if (
            not isinstance(eot_id, int)
            or tokenizer.decode([eot_id], skip_special_tokens=False) != end_of_turn
        ):
            raise TemplateError(f"end-of-turn marker {end_of_turn!r} is not a single token of this tokenizer")
        self._stop = frozenset((eot_id,))
        base = [{"role": "system", "content": _STUB}, {"role": "user", "content": _STUB}]
        without = self._text(base, None, False)
        with_prompt = self._text(base, None, True)
        if not with_prompt.startswith(without):
            raise TemplateError("the generation prompt rewrites the conversation before it")
        self._generation_text = with_prompt[len(without) :]
        self._generation_prompt = self._encode(self._generation_text)
        self.report = self.check_append_only(*_probe())
        if strict:
            self.report.raise_if_violated(self.name)

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return self._stop

    def render_system(self, system: str, tools: Sequence[ToolSpec]) -> list[int]:
        return self._encode(self._text([{"role": "system", "content": system}], tools, False))

    def render_message(self, message: Message, previous: Message | None = None) -> list[int]:
        return self._encode(self._segment_text(message, previous))

    def render_generation_prompt(self) -> list[int]:
        return list(self._generation_prompt)

    def encode_output(self, message: Message) -> list[int]:
        body, _ = self._split_assistant(message)
        return self._encode(body)

    def close_output(self, output_ids: Sequence[int]) -> list[int]:
        _, tail = self._split_assistant(Message("assistant", (TextBlock(_STUB),)))
        if output_ids and output_ids[-1] in self._stop:
            return self._encode(tail)
        return self._encode(self.end_of_turn + tail)

    def decode_output(self, output_ids: Sequence[int]) -> str:
        ids = list(output_ids)
        if ids and ids[-1] in self._stop:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def render_conversation(
        self, system: str, tools: Sequence[ToolSpec], messages: Sequence[Message], add_generation_prompt: bool
    ) -> list[int]:
        dicts = [{"role": "system", "content": system}] + [d for m in messages for d in _to_dicts(m)]
        return self._encode(self._text(dicts, tools, add_generation_prompt))

    def _segment_text(self, message: Message, previous: Message | None) -> str:
        context = [{"role": "system", "content": _STUB}] + (_to_dicts(previous) if previous else [])
        before = self._text(context, None, False)
        after = self._text(context + _to_dicts(message), None, False)
        if not after.startswith(before):
            raise TemplateError(f"rendering a {message.role} message rewrites the turn before it")
        return after[len(before) :]

    def _split_assistant(self, message: Message) -> tuple[str, str]:
        """(output text incl. the end-of-turn marker, supplied text after it)."""
        segment = self._segment_text(message, Message.text("user", _STUB))
        if not segment.startswith(self._generation_text):
            raise TemplateError("an assistant turn does not start with the generation prompt")
        body = segment[len(self._generation_text) :]
        end = body.rfind(self.end_of_turn)
        if end < 0:
            raise TemplateError(f"an assistant turn does not contain {self.end_of_turn!r}")
        cut = end + len(self.end_of_turn)
        return body[:cut], body[cut:]

    def _text(
        self, dicts: list[dict[str, Any]], tools: Sequence[ToolSpec] | None, add_generation_prompt: bool
    ) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        text = self.tokenizer.apply_chat_template(dicts, **kwargs)
        assert isinstance(text, str)
        return text

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _to_dicts(message: Message) -> list[dict[str, Any]]:
    """One internal message → the OpenAI-style dicts HF chat templates read."""
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.text_content()}
        thinking = "\n".join(b.thinking for b in message.blocks if isinstance(b, ThinkingBlock))
        if thinking:
            out["reasoning_content"] = thinking
        calls = [b for b in message.blocks if isinstance(b, ToolUseBlock)]
        if calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.input}}
                for c in calls
            ]
        return [out]
    dicts: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in message.blocks:
        if isinstance(block, ToolResultBlock):
            if texts:
                dicts.append({"role": message.role, "content": "\n".join(texts)})
                texts = []
            dicts.append({"role": "tool", "content": block.content, "tool_call_id": block.tool_use_id})
        elif isinstance(block, TextBlock):
            texts.append(block.text)
    if texts or not dicts:
        dicts.append({"role": message.role, "content": "\n".join(texts)})
    return dicts


def _probe() -> tuple[str, list[ToolSpec], list[Message]]:
    """A conversation exercising thinking, a tool call, a tool result and a second user turn."""
    tools = [ToolSpec("probe", "A probe tool.", {"type": "object", "properties": {"x": {"type": "string"}}})]
    messages = [
        Message.text("user", "first question"),
        Message(
            "assistant",
            (ThinkingBlock("reasoning"), TextBlock("Calling."), ToolUseBlock("call_1", "probe", {"x": "1"})),
        ),
        Message("tool", (ToolResultBlock("call_1", "result"),)),
        Message("assistant", (ThinkingBlock("more reasoning"), TextBlock("Answer."))),
        Message.text("user", "second question"),
        Message("assistant", (TextBlock("Final."),)),
    ]
    return "You are a probe.", tools, messages


__all__ = ["AppendOnlyReport", "HFChatTemplate", "HFTokenizer"]
