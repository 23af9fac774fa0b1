"""`HFChatTemplate`: message segments from a model's own Hugging Face chat template.

The proxy records prompts as the model was trained to read them: rendering goes through the
checkpoint's Jinja chat template with transformers' renderer (`gyre.model.chat`), tokenized by the
checkpoint's tokenizer (`gyre.model.tokenizer`). A message's segment is the text its render appends
to a short, fixed context (a stand-in system turn and the previous message), tokenized on its own —
cost proportional to the message, not to the history. That is only correct for append-only
templates whose segments tokenize independently, so the constructor probes the template with a
conversation that has thinking, tool calls, tool results, a second user turn and a sub-agent-style
fresh system prompt, and raises `TemplateError` when `check_append_only` finds a violation (the
usual culprit: a template that drops the reasoning of turns before the last user query, as the
template Qwen3 checkpoints ship does). `strict=False` keeps such a template anyway: segments then
carry every turn as it was sampled (the TITO rule), which is not what the template would render,
and `report` says where the two part; `template_for_model` puts the registry's verified template of
the family in its place instead (gyre.trajectory.templates.registry).

    template = HFChatTemplate(Tokenizer.from_dir(path), end_of_turn="<|im_end|>", tool_call_parser="hermes")
    template = template_for_family("chatml")        # the embedded demo model's format, no files needed
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gyre.model.chat import render_chat
from gyre.model.tokenizer import Tokenizer
from gyre.trajectory.messages import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    root_digest,
)
from gyre.trajectory.templates.base import AppendOnlyReport, ChatTemplate, TemplateError
from gyre.trajectory.templates.registry import Substitution

_STUB = "S"
_ROOTS_KEPT = 16
"""Rendered root segments (system prompt + tools) whose ids `render_system` keeps."""


class HFChatTemplate(ChatTemplate):
    """Per-message segments of a Jinja chat template (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        end_of_turn: str,
        tool_call_parser: str = "hermes",
        stop_token_ids: Iterable[int] = (),
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        strict: bool = True,
    ) -> None:
        super().__init__(tool_call_parser)
        self.tokenizer = tokenizer
        self._roots: OrderedDict[bytes, npt.NDArray[np.int32]] = OrderedDict()
        template = chat_template or tokenizer.chat_template
        if not template:
            raise TemplateError(f"{tokenizer.source or 'the tokenizer'} has no chat template")
        self.chat_template = template
        self.end_of_turn = end_of_turn
        self._variables = {**tokenizer.template_variables(), **dict(template_kwargs or {})}
        if not tokenizer.has_token(end_of_turn):
            raise TemplateError(f"end-of-turn marker {end_of_turn!r} is not a token of this tokenizer")
        eot_id = tokenizer.encode(end_of_turn)
        if len(eot_id) != 1:
            raise TemplateError(f"end-of-turn marker {end_of_turn!r} is not a single token of this tokenizer")
        self._stop = frozenset((eot_id[0], *stop_token_ids))
        self.name = template_name(template, end_of_turn, tool_call_parser)
        self.substitution: Substitution | None = None
        """Set when this template renders in place of the model's own (`template_for_model`, mode auto)."""
        base = [{"role": "system", "content": _STUB}, {"role": "user", "content": _STUB}]
        without = self._text(base, None, False)
        with_prompt = self._text(base, None, True)
        if not with_prompt.startswith(without):
            raise TemplateError("the generation prompt rewrites the conversation before it")
        self._generation_text = with_prompt[len(without) :]
        self._generation_prompt = self.encode(self._generation_text)
        _, tail = self._split_assistant(Message("assistant", (TextBlock(_STUB),)))
        self._close_stopped = self.encode(tail)
        """What the template supplies after an output that ended on a stop token (every call's commit)."""
        self._close_open = self.encode(self.end_of_turn + tail)
        self.report = self.check_append_only(*probe_conversation())
        if strict:
            self.report.raise_if_violated(self.name)

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return self._stop

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def system_text(self, system: str, tools: Sequence[ToolSpec]) -> str:
        return self._text([{"role": "system", "content": system}], tools, False)

    def message_text(self, message: Message, previous: Message | None = None) -> str:
        return self._segment_text(message, previous)

    def kept_root_ids(self, system: str, tools: Sequence[ToolSpec]) -> npt.NDArray[np.int32] | None:
        """A harness sends the same system prompt and tools to every execution it runs (Claude Code's
        are tens of KB), so the ids of the last few roots are kept: tokenizing them again was a quarter
        of the proxy's CPU under load (`gyre bench load`). Kept by the root's digest (the rendering is a
        function of system and tools), as read-only arrays the trees' root nodes share."""
        key = root_digest(system, tuple(tools))
        ids = self._roots.get(key)
        if ids is not None:
            self._roots.move_to_end(key)
        return ids

    def keep_root_ids(
        self, system: str, tools: Sequence[ToolSpec], ids: Sequence[int]
    ) -> npt.NDArray[np.int32]:
        array = super().keep_root_ids(system, tools, ids)
        self._roots[root_digest(system, tuple(tools))] = array
        while len(self._roots) > _ROOTS_KEPT:
            del self._roots[next(iter(self._roots))]
        return array

    def render_generation_prompt(self) -> list[int]:
        return list(self._generation_prompt)

    def encode_output(self, message: Message) -> list[int]:
        body, _ = self._split_assistant(message)
        return self.encode(body)

    def close_output(self, output_ids: Sequence[int]) -> list[int]:
        return list(self._close_stopped if output_ids and output_ids[-1] in self._stop else self._close_open)

    def decode_output(self, output_ids: Sequence[int]) -> str:
        ids = list(output_ids)
        if ids and ids[-1] in self._stop:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def render_conversation(
        self, system: str, tools: Sequence[ToolSpec], messages: Sequence[Message], add_generation_prompt: bool
    ) -> list[int]:
        dicts = [{"role": "system", "content": system}] + [d for m in messages for d in _to_dicts(m)]
        return self.encode(self._text(dicts, tools, add_generation_prompt))

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
        specs = (
            [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
            if tools
            else None
        )
        try:
            return render_chat(
                self.chat_template,
                dicts,
                tools=specs,
                add_generation_prompt=add_generation_prompt,
                variables=self._variables,
            )
        except Exception as e:  # Jinja raises its own error types (and the template's raise_exception)
            raise TemplateError(f"the chat template failed to render: {e}") from e


def template_name(chat_template: str, end_of_turn: str, tool_call_parser: str) -> str:
    """The name trees record a rendering under: `hf-` and a digest of what decides it."""
    digest = hashlib.sha256(f"{chat_template}\0{end_of_turn}\0{tool_call_parser}".encode()).hexdigest()
    return f"hf-{digest[:12]}"


def _to_dicts(message: Message) -> list[dict[str, Any]]:
    """One internal message → the OpenAI-style dicts HF chat templates read."""
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.text_content()}
        thinking = [b.thinking for b in message.blocks if isinstance(b, ThinkingBlock)]
        if thinking:
            out["reasoning_content"] = "\n".join(thinking)
        calls = [b for b in message.blocks if isinstance(b, ToolUseBlock)]
        if calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.input},
                    **({"raw": c.raw} if c.raw is not None else {}),
                }
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
            dicts.append(
                {
                    "role": "tool",
                    "content": block.content,
                    "tool_call_id": block.tool_use_id,
                    "is_error": block.is_error,
                }
            )
        elif isinstance(block, TextBlock):
            texts.append(block.text)
    if texts or not dicts:
        dicts.append({"role": message.role, "content": "\n".join(texts)})
    return dicts


def probe_conversation() -> tuple[str, list[ToolSpec], list[Message]]:
    """A conversation exercising thinking, parallel tool calls, tool results and a second user turn."""
    tools = [ToolSpec("probe", "A probe tool.", {"type": "object", "properties": {"x": {"type": "string"}}})]
    messages = [
        Message.text("user", "first question"),
        Message(
            "assistant",
            (
                ThinkingBlock("reasoning"),
                TextBlock("Calling."),
                ToolUseBlock("call_1", "probe", {"x": "1"}),
                ToolUseBlock("call_2", "probe", {"x": "2"}),
            ),
        ),
        Message("tool", (ToolResultBlock("call_1", "result 1"), ToolResultBlock("call_2", "result 2"))),
        Message("assistant", (ThinkingBlock("more reasoning"), TextBlock("Answer."))),
        Message.text("user", "second question"),
        Message("assistant", (ThinkingBlock("last reasoning"), TextBlock("Final."))),
    ]
    return "You are a probe.", tools, messages


__all__ = ["AppendOnlyReport", "HFChatTemplate", "probe_conversation", "template_name"]
