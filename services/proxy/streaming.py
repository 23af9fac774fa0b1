"""Engine output ids → API-neutral stream events, exactly as the final parse will see them.

A streaming harness must see the same assistant message that the tree records: the harness
echoes it back on its next call and the tree matches the echo by digest. So the events a
`OutputStreamer` emits, folded together, equal `prepared.parse_output(all_ids)` — block by
block, text by text, tool-call ids included. Where the parser's answer still depends on ids not
yet generated, the streamer waits:

- `HermesStreamer` (the `hermes` parser): text before `</think>` is thinking only if no
  `<tool_call>` precedes it, and is plain text if `</think>` never comes, so nothing is emitted
  until `</think>`, a `<tool_call>` or the end decides it; after that, text streams as it arrives
  (holding back a possible partial `<tool_call>`), and a tool call is emitted whole once its
  `</tool_call>` arrives and its JSON is known to be valid (a malformed call stays text).
- `BufferedStreamer` (any other parser): emits everything at the end from the full parse.

Adding a streamer for a new parser: subclass `OutputStreamer`, register it in `STREAMERS` under
the parser's name; tests/unit/proxy/test_streaming.py checks every entry against the parser.
Ids are decoded incrementally by `Detokenizer` (stop tokens are held back: the template strips
the final one before parsing).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gyre.trajectory.messages import TextBlock, ThinkingBlock, ToolUseBlock
from gyre.trajectory.output import AssistantOutput, ParsedCall, ToolCallParser, assemble_output, tool_call_id
from gyre.trajectory.templates.base import ChatTemplate

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True, slots=True)
class ThinkingDone:
    """A whole thinking block (emitted once it is certain)."""

    text: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    """More text of the current text block (a block opens with its first delta)."""

    text: str


@dataclass(frozen=True, slots=True)
class TextEnd:
    """The current text block is complete."""


@dataclass(frozen=True, slots=True)
class ToolCallDone:
    """A complete tool call with its final id."""

    call: ToolUseBlock


StreamEvent = ThinkingDone | TextDelta | TextEnd | ToolCallDone


def fold_events(events: Sequence[StreamEvent], stopped: bool) -> AssistantOutput:
    """The `AssistantOutput` a sequence of events describes (what a client assembles)."""
    blocks: list[TextBlock | ThinkingBlock | ToolUseBlock] = []
    text: list[str] | None = None
    for event in events:
        if isinstance(event, TextDelta):
            text = text if text is not None else []
            text.append(event.text)
            continue
        if text is not None:
            blocks.append(TextBlock("".join(text)))
            text = None
        if isinstance(event, TextEnd):
            continue
        if isinstance(event, ThinkingDone):
            blocks.append(ThinkingBlock(event.text))
        elif isinstance(event, ToolCallDone):
            blocks.append(event.call)
    if text is not None:
        blocks.append(TextBlock("".join(text)))
    return AssistantOutput(tuple(blocks), stopped)


class Detokenizer:
    """Output ids → text, incrementally, equal to the template's `decode_output` of all ids: the
    usual offset window (a text ending in U+FFFD waits for its next id)."""

    def __init__(self, template: ChatTemplate) -> None:
        self._template = template
        self._stops = template.stop_token_ids
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._held: int | None = None
        self._sentinel = min(self._stops) if self._stops else None

    def feed(self, ids: Sequence[int]) -> str:
        pending = list(ids)
        if not pending:
            return ""
        if self._held is not None:
            pending.insert(0, self._held)
            self._held = None
        if pending[-1] in self._stops:
            self._held = pending.pop()
        return self._decode(pending, final=False)

    def finish(self) -> str:
        """The rest of the text; a held final stop token is dropped, as `decode_output` does."""
        self._held = None
        return self._decode([], final=True)

    def _decode(self, ids: list[int], final: bool) -> str:
        self._ids.extend(ids)
        prefix_text = self._window(self._ids[self._prefix : self._read])
        text = self._window(self._ids[self._prefix :])
        if not final and (text.endswith("\ufffd") or len(text) < len(prefix_text)):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix_text) :]

    def _window(self, ids: list[int]) -> str:
        """Decode ids as they are: `decode_output` strips one trailing stop id, so give it one."""
        return self._template.decode_output([*ids, self._sentinel] if self._sentinel is not None else ids)


class OutputStreamer(ABC):
    """Turns decoded output text into stream events; `finish` flushes what is left."""

    parser_name: ClassVar[str]

    def __init__(self, parser: ToolCallParser, id_seed: bytes, id_prefix: str) -> None:
        self.parser = parser
        self.id_seed = id_seed
        self.id_prefix = id_prefix

    @abstractmethod
    def feed(self, text: str) -> list[StreamEvent]:
        """Events made certain by `text` (appended to the output so far)."""

    @abstractmethod
    def finish(self, stopped: bool) -> list[StreamEvent]:
        """The remaining events once the output is complete."""


class BufferedStreamer(OutputStreamer):
    """Emits everything at the end from the full parse: correct for any parser."""

    parser_name = ""

    def __init__(self, parser: ToolCallParser, id_seed: bytes, id_prefix: str) -> None:
        super().__init__(parser, id_seed, id_prefix)
        self._text: list[str] = []

    def feed(self, text: str) -> list[StreamEvent]:
        self._text.append(text)
        return []

    def finish(self, stopped: bool) -> list[StreamEvent]:
        parsed = self.parser.parse("".join(self._text))
        output = assemble_output(parsed, stopped, self.id_seed, self.id_prefix)
        events: list[StreamEvent] = []
        for block in output.blocks:
            if isinstance(block, ThinkingBlock):
                events.append(ThinkingDone(block.thinking))
            elif isinstance(block, TextBlock):
                if block.text:
                    events += [TextDelta(block.text), TextEnd()]
            else:
                events.append(ToolCallDone(block))
        return events


class HermesStreamer(OutputStreamer):
    """Incremental twin of `HermesParser` (see the module docstring)."""

    parser_name = "hermes"

    def __init__(self, parser: ToolCallParser, id_seed: bytes, id_prefix: str) -> None:
        super().__init__(parser, id_seed, id_prefix)
        self._head: str | None = ""
        """Text while thinking is undecided; None once decided."""
        self._body = ""
        """Body text not yet emitted (a pending partial or unclosed tool call)."""
        self._in_text = False
        self._num_calls = 0

    def feed(self, text: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if self._head is not None:
            self._head += text
            self._decide_head(events, final=False)
        else:
            self._body += text
        if self._head is None:
            self._drain_body(events, final=False)
        return events

    def finish(self, stopped: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if self._head is not None:
            self._decide_head(events, final=True)
        self._drain_body(events, final=True)
        return events

    def _decide_head(self, events: list[StreamEvent], final: bool) -> None:
        head = self._head
        assert head is not None
        end_think = head.find(THINK_CLOSE)
        call = head.find(CALL_OPEN)
        if end_think >= 0 and (call < 0 or call > end_think):
            start = head.find(THINK_OPEN, 0, end_think)
            thinking = head[start + len(THINK_OPEN) : end_think] if start >= 0 else head[:end_think]
            events.append(ThinkingDone(thinking))
            self._body = head[end_think + len(THINK_CLOSE) :]
        elif call >= 0 or final:
            self._body = head
        else:
            return
        self._head = None

    def _drain_body(self, events: list[StreamEvent], final: bool) -> None:
        body = self._body
        while True:
            start = body.find(CALL_OPEN)
            if start < 0:
                keep = 0 if final else _partial_suffix(body, CALL_OPEN)
                self._text(events, body[: len(body) - keep])
                body = body[len(body) - keep :]
                break
            self._text(events, body[:start])
            body = body[start:]
            end = body.find(CALL_CLOSE, len(CALL_OPEN))
            if end < 0:
                if final:
                    self._text(events, body)
                    body = ""
                break
            raw = body[len(CALL_OPEN) : end]
            whole = body[: end + len(CALL_CLOSE)]
            body = body[end + len(CALL_CLOSE) :]
            parsed = self.parser.parse(whole)
            if len(parsed) == 1 and isinstance(parsed[0], ParsedCall):
                self._end_text(events)
                events.append(ToolCallDone(self._call(parsed[0], raw)))
            else:
                self._text(events, whole)
        self._body = body
        if final:
            self._end_text(events)

    def _call(self, parsed: ParsedCall, raw: str) -> ToolUseBlock:
        call_id = tool_call_id(self.id_seed, self._num_calls, raw, self.id_prefix)
        self._num_calls += 1
        return ToolUseBlock(call_id, parsed.name, parsed.arguments, raw)

    def _text(self, events: list[StreamEvent], text: str) -> None:
        if text:
            self._in_text = True
            events.append(TextDelta(text))

    def _end_text(self, events: list[StreamEvent]) -> None:
        if self._in_text:
            events.append(TextEnd())
            self._in_text = False


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


STREAMERS: dict[str, type[OutputStreamer]] = {HermesStreamer.parser_name: HermesStreamer}


def make_streamer(template: ChatTemplate, id_seed: bytes, id_prefix: str) -> OutputStreamer:
    """The streamer registered for the template's tool-call parser (buffered if none is)."""
    cls = STREAMERS.get(template.parser.name, BufferedStreamer)
    return cls(template.parser, id_seed, id_prefix)
