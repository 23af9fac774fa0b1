"""Engine output → assistant message: the tool-call parser registry and `parse_output`.

The engine returns token ids; the chat template decodes them to text (special tokens as their
literal strings, stop tokens removed) and a `ToolCallParser` splits that text into thinking,
text and tool calls. Tool-call ids are generated deterministically from an id seed (the tree
passes the digest of the path the output extends) and the call's position and payload, so the
same output at the same place always gets the same ids, and different places get different ones.
A tool call whose payload is not valid JSON stays plain text: parsing never fails.

Adding a parser: subclass `ToolCallParser`, set `name`, implement `parse`, and add it to
`PARSERS`; the contract test in tests/unit/trajectory/test_output.py runs over every entry.
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

from gyre.trajectory.messages import JSONValue, Message, TextBlock, ThinkingBlock, ToolUseBlock

FinishReason = Literal["stop", "tool_calls", "length"]
OutputBlock = TextBlock | ThinkingBlock | ToolUseBlock


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """A tool call found in output text, before it gets an id."""

    name: str
    arguments: JSONValue
    raw: str


@dataclass(frozen=True, slots=True)
class AssistantOutput:
    """An engine output in API-neutral form: blocks in emission order, and how it ended."""

    blocks: tuple[OutputBlock, ...]
    stopped: bool
    """True when the output ended on a stop token (False: cut by max_tokens)."""

    @property
    def finish_reason(self) -> FinishReason:
        if self.tool_calls:
            return "tool_calls"
        return "stop" if self.stopped else "length"

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.blocks if isinstance(b, TextBlock))

    @property
    def thinking(self) -> str:
        return "\n".join(b.thinking for b in self.blocks if isinstance(b, ThinkingBlock))

    @property
    def tool_calls(self) -> tuple[ToolUseBlock, ...]:
        return tuple(b for b in self.blocks if isinstance(b, ToolUseBlock))

    def to_message(self) -> Message:
        return Message("assistant", self.blocks)


class ToolCallParser(ABC):
    """Splits decoded output text into thinking, text and tool calls."""

    name: ClassVar[str]

    @abstractmethod
    def parse(self, text: str) -> list[TextBlock | ThinkingBlock | ParsedCall]:
        """Blocks in order; must not raise on any input."""


class HermesParser(ToolCallParser):
    """`<think>…</think>` then text with `<tool_call>{"name": …, "arguments": {…}}</tool_call>` calls."""

    name = "hermes"
    _call = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> list[TextBlock | ThinkingBlock | ParsedCall]:
        blocks: list[TextBlock | ThinkingBlock | ParsedCall] = []
        end_think = text.find("</think>")
        if end_think >= 0 and "<tool_call>" not in text[:end_think]:
            start = text.find("<think>", 0, end_think)
            thinking = text[start + len("<think>") : end_think] if start >= 0 else text[:end_think]
            blocks.append(ThinkingBlock(thinking))
            text = text[end_think + len("</think>") :]
        pos = 0
        for match in self._call.finditer(text):
            call = _hermes_call(match.group(1))
            if call is None:
                continue  # malformed: stays part of the surrounding text
            if match.start() > pos:
                blocks.append(TextBlock(text[pos : match.start()]))
            blocks.append(call)
            pos = match.end()
        if pos < len(text):
            blocks.append(TextBlock(text[pos:]))
        return blocks


def _hermes_call(raw: str) -> ParsedCall | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return _json_call(obj, raw, arguments_key="arguments")


class Llama3JsonParser(ToolCallParser):
    """Llama 3.1 JSON tool calls: the output ends in one or more `{"name": …, "parameters": {…}}`
    objects (optionally after `<|python_tag|>`), each starting a line, separated by newlines or `;`.
    Text before the first call is the message's text (one newline before the call is the
    template's separator, not text); anything that does not parse stays text."""

    name = "llama3_json"
    _decoder = json.JSONDecoder()

    def parse(self, text: str) -> list[TextBlock | ThinkingBlock | ParsedCall]:
        starts = [i for i, ch in enumerate(text) if ch == "{" and (i == 0 or text[i - 1] == "\n")]
        tag = text.find("<|python_tag|>")
        if tag >= 0:
            starts.insert(0, tag + len("<|python_tag|>"))
        for start in starts:
            calls = self._calls_from(text, start)
            if calls is None:
                continue
            prefix = text[:tag] if tag >= 0 and start == tag + len("<|python_tag|>") else text[:start]
            prefix = prefix[:-1] if prefix.endswith("\n") else prefix
            blocks: list[TextBlock | ThinkingBlock | ParsedCall] = [TextBlock(prefix)] if prefix else []
            return [*blocks, *calls]
        return [TextBlock(text)] if text else []

    def _calls_from(self, text: str, pos: int) -> list[ParsedCall] | None:
        calls: list[ParsedCall] = []
        while True:
            while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
                pos += 1
            if pos == len(text):
                return calls or None
            try:
                obj, end = self._decoder.raw_decode(text, pos)
            except ValueError:
                return None
            call = _json_call(obj, text[pos:end], arguments_key="parameters")
            if call is None:
                return None
            calls.append(call)
            pos = end


def _json_call(obj: object, raw: str, arguments_key: str) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(obj["name"], arguments, raw)


PARSERS: dict[str, type[ToolCallParser]] = {
    HermesParser.name: HermesParser,
    Llama3JsonParser.name: Llama3JsonParser,
}


def tool_call_id(id_seed: bytes, index: int, raw: str, prefix: str = "call_") -> str:
    """A deterministic call id: unique per (place in the tree, position in the output, payload)."""
    h = hashlib.blake2b(
        id_seed + index.to_bytes(4, "little") + raw.encode("utf-8", "surrogatepass"), digest_size=12
    )
    return prefix + h.hexdigest()


def assemble_output(
    parsed: list[TextBlock | ThinkingBlock | ParsedCall],
    stopped: bool,
    id_seed: bytes,
    id_prefix: str = "call_",
) -> AssistantOutput:
    """Give parsed calls their ids and build the `AssistantOutput`."""
    blocks: list[OutputBlock] = []
    index = 0
    for item in parsed:
        if isinstance(item, ParsedCall):
            call_id = tool_call_id(id_seed, index, item.raw, id_prefix)
            blocks.append(ToolUseBlock(call_id, item.name, item.arguments, item.raw))
            index += 1
        else:
            blocks.append(item)
    return AssistantOutput(tuple(blocks), stopped)
