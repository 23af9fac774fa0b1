"""The `embedded` chat template: what the embedded byte-level model is trained on.

ChatML-style turns with the ByteTokenizer's special ids and no filler (every byte is a token):

    <|im_start|>system\\n{system}\\n# Tools\\n{"name":…,"description":…,"parameters":…}\\n…<|im_end|>
    <|im_start|>user\\n{text}<|im_end|>
    <|im_start|>assistant\\n<think>{thinking}</think>{text}<tool_call>{"name":…,"arguments":{…}}</tool_call><|im_end|>
    <|im_start|>tool\\n{result}<|im_end|>            (`tool error` when the result is an error)

No newline follows `<|im_end|>`: special ids delimit turns. The engine output of an assistant turn
is everything after `<|im_start|>assistant\\n` up to and including `<|im_end|>`, so a recorded
output is exactly the ids the engine sampled. A tool call the engine emitted is rendered from its
raw payload, so re-rendering reproduces the sampled bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from gyre.model.tokenizer import ByteTokenizer
from gyre.trajectory.messages import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre.trajectory.templates.base import ChatTemplate


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", "surrogatepass"))


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class EmbeddedTemplate(ChatTemplate):
    """ChatML over the byte tokenizer (see the module docstring for the exact layout)."""

    name = "embedded"

    def __init__(self, tool_call_parser: str = "hermes", tokenizer: ByteTokenizer | None = None) -> None:
        super().__init__(tool_call_parser)
        self.tokenizer = tokenizer or ByteTokenizer()
        sid = self.tokenizer.special_id
        self.im_start, self.im_end, self.eos = sid("<|im_start|>"), sid("<|im_end|>"), sid("<|endoftext|>")
        self.call_start, self.call_end = sid("<tool_call>"), sid("</tool_call>")
        self.think_start, self.think_end = sid("<think>"), sid("</think>")
        self._stop = frozenset((self.im_end, self.eos))
        self._generation_prompt = [self.im_start, *_bytes("assistant\n")]

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return self._stop

    def render_system(self, system: str, tools: Sequence[ToolSpec]) -> list[int]:
        if not system and not tools:
            return []
        text = system
        if tools:
            lines = [
                _compact({"name": t.name, "description": t.description, "parameters": t.parameters})
                for t in tools
            ]
            text += ("\n" if system else "") + "# Tools\n" + "\n".join(lines)
        return [self.im_start, *_bytes("system\n" + text), self.im_end]

    def render_message(self, message: Message, previous: Message | None = None) -> list[int]:
        if message.role == "assistant":
            return self._generation_prompt + self.encode_output(message)
        ids: list[int] = []
        texts: list[str] = []
        for block in message.blocks:
            if isinstance(block, ToolResultBlock):
                if texts:
                    self._flush(ids, message.role, texts)
                header = "tool error\n" if block.is_error else "tool\n"
                ids += [self.im_start, *_bytes(header + block.content), self.im_end]
            elif isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ThinkingBlock):
                texts.append(block.thinking)
            else:
                texts.append(self._call_payload(block))
        if texts or not ids:
            self._flush(ids, message.role, texts)
        return ids

    def render_generation_prompt(self) -> list[int]:
        return list(self._generation_prompt)

    def encode_output(self, message: Message) -> list[int]:
        ids: list[int] = []
        for block in message.blocks:
            if isinstance(block, ThinkingBlock):
                ids += [self.think_start, *_bytes(block.thinking), self.think_end]
            elif isinstance(block, TextBlock):
                ids += _bytes(block.text)
            elif isinstance(block, ToolUseBlock):
                ids += [self.call_start, *_bytes(self._call_payload(block)), self.call_end]
            else:
                ids += _bytes(block.content)
        ids.append(self.im_end)
        return ids

    def close_output(self, output_ids: Sequence[int]) -> list[int]:
        return [] if output_ids and output_ids[-1] in self._stop else [self.im_end]

    def decode_output(self, output_ids: Sequence[int]) -> str:
        ids = list(output_ids)
        if ids and ids[-1] in self._stop:
            ids.pop()
        return self.tokenizer.decode(ids)

    def render_conversation(
        self, system: str, tools: Sequence[ToolSpec], messages: Sequence[Message], add_generation_prompt: bool
    ) -> list[int]:
        ids = self.render_system(system, tools)
        for message in messages:
            ids += self.render_message(message)
        if add_generation_prompt:
            ids += self._generation_prompt
        return ids

    def _flush(self, ids: list[int], role: str, texts: list[str]) -> None:
        ids += [self.im_start, *_bytes(f"{role}\n" + "\n".join(texts)), self.im_end]
        texts.clear()

    @staticmethod
    def _call_payload(block: ToolUseBlock) -> str:
        if block.raw is not None:
            return block.raw
        return _compact({"name": block.name, "arguments": block.input})
