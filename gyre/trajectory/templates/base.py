"""The chat-template interface: messages → token segments that concatenate to the full prompt.

A template renders the root segment (system prompt + tool definitions), one segment per message,
and the generation prompt. TITO depends on one property: the concatenation of the segments is
exactly the render of the whole conversation, and rendering a conversation and then appending a
message only appends tokens ("append-only"). Templates that rewrite earlier turns (e.g. ones that
strip earlier thinking) break it; `check_append_only` detects that and reports where, so such a
template is refused instead of silently mis-recorded.

Assistant turns: `render_message(m)` must equal `render_generation_prompt() + encode_output(m) +
close_output(encode_output(m))` — the generation prompt and the closing tokens are supplied, what
lies between is what the engine emits (ending with a stop token).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gyre.errors import StartupError
from gyre.trajectory.messages import Message, ToolSpec
from gyre.trajectory.output import PARSERS, AssistantOutput, ToolCallParser, assemble_output


class TemplateError(StartupError):
    """A chat template cannot be used for TITO recording (e.g. it is not append-only)."""


@dataclass(slots=True)
class AppendOnlyReport:
    """Result of `check_append_only`: empty `violations` means the template is append-only."""

    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def raise_if_violated(self, template: str) -> None:
        if self.violations:
            raise TemplateError(
                f"chat template {template!r} is not append-only: " + "; ".join(self.violations)
            )


class ChatTemplate(ABC):
    """Renders messages to token segments. `name` identifies the rendering (trees record it, and a
    tree is only ever extended by a template of the same name)."""

    name: str

    def __init__(self, tool_call_parser: str = "hermes") -> None:
        if tool_call_parser not in PARSERS:
            raise ValueError(
                f"unknown tool-call parser {tool_call_parser!r}; choose one of {sorted(PARSERS)}"
            )
        self.parser: ToolCallParser = PARSERS[tool_call_parser]()

    @property
    @abstractmethod
    def stop_token_ids(self) -> frozenset[int]:
        """Ids that end an assistant turn (the engine stops on them)."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """The ids of rendered text (special tokens in it included). Safe to call from other threads:
        the proxy encodes large segments off its event loop."""

    @abstractmethod
    def system_text(self, system: str, tools: Sequence[ToolSpec]) -> str:
        """The root segment's text: the system turn with the tool definitions."""

    @abstractmethod
    def message_text(self, message: Message, previous: Message | None = None) -> str:
        """One message's segment text; `previous` is the message before it (None after the system turn)."""

    def kept_root_ids(self, system: str, tools: Sequence[ToolSpec]) -> npt.NDArray[np.int32] | None:
        """The root ids this template kept from an earlier `keep_root_ids`, if it keeps any."""
        return None

    def keep_root_ids(
        self, system: str, tools: Sequence[ToolSpec], ids: Sequence[int]
    ) -> npt.NDArray[np.int32]:
        """The encoded `system_text` as a read-only int32 array, which a template may keep: every
        execution of a harness opens its tree with the same system prompt and tools."""
        array = np.asarray(ids, dtype=np.int32)
        array.flags.writeable = False
        return array

    def root_ids(self, system: str, tools: Sequence[ToolSpec]) -> npt.NDArray[np.int32]:
        """The root segment's ids, read-only (kept ones, else encoded now)."""
        kept = self.kept_root_ids(system, tools)
        if kept is not None:
            return kept
        return self.keep_root_ids(system, tools, self.encode(self.system_text(system, tools)))

    def render_system(self, system: str, tools: Sequence[ToolSpec]) -> list[int]:
        """The root segment: the system turn with the tool definitions."""
        ids: list[int] = self.root_ids(system, tools).tolist()
        return ids

    def render_message(self, message: Message, previous: Message | None = None) -> list[int]:
        """One message's segment; `previous` is the message before it (None after the system turn)."""
        return self.encode(self.message_text(message, previous))

    @abstractmethod
    def render_generation_prompt(self) -> list[int]:
        """The tokens that open the assistant turn the engine completes."""

    @abstractmethod
    def encode_output(self, message: Message) -> list[int]:
        """The ids the engine would emit for an assistant message (ending with a stop token)."""

    @abstractmethod
    def close_output(self, output_ids: Sequence[int]) -> list[int]:
        """Supplied ids that follow an engine output to complete the turn (closing a cut output)."""

    @abstractmethod
    def decode_output(self, output_ids: Sequence[int]) -> str:
        """Output text for the tool-call parser: special tokens literal, stop tokens removed."""

    @abstractmethod
    def render_conversation(
        self, system: str, tools: Sequence[ToolSpec], messages: Sequence[Message], add_generation_prompt: bool
    ) -> list[int]:
        """The whole prompt rendered in one piece (the reference the segments are checked against)."""

    def parse_output(
        self, output_ids: Sequence[int], id_seed: bytes = b"", id_prefix: str = "call_"
    ) -> AssistantOutput:
        """Engine output ids → `AssistantOutput` (deterministic call ids from `id_seed`)."""
        stopped = bool(output_ids) and output_ids[-1] in self.stop_token_ids
        return assemble_output(self.parser.parse(self.decode_output(output_ids)), stopped, id_seed, id_prefix)

    def render_segments(
        self, system: str, tools: Sequence[ToolSpec], messages: Sequence[Message]
    ) -> list[list[int]]:
        """Root segment followed by one segment per message."""
        segments = [self.render_system(system, tools)]
        previous: Message | None = None
        for message in messages:
            segments.append(self.render_message(message, previous))
            previous = message
        return segments

    def check_append_only(
        self, system: str, tools: Sequence[ToolSpec], messages: Sequence[Message]
    ) -> AppendOnlyReport:
        """Check on one conversation that segments concatenate to the full render, that every
        prefix renders to a prefix, and that assistant turns split as the class docstring says. A
        render the template refuses (it raises) is a violation too."""
        report = AppendOnlyReport()

        def render(count: int, add_generation_prompt: bool) -> list[int] | None:
            try:
                return self.render_conversation(system, tools, messages[:count], add_generation_prompt)
            except TemplateError as e:
                if str(e) not in report.violations:
                    report.violations.append(str(e))
                return None

        try:
            segments = self.render_segments(system, tools, messages)
        except TemplateError as e:
            report.violations.append(str(e))
            segments = []
        joined = [t for seg in segments for t in seg]
        full = render(len(messages), False)
        if segments and full is not None and joined != full:
            report.violations.append(
                f"per-message segments differ from the full render at token {_first_diff(joined, full)}"
            )
        previous = render(0, False)
        for k in range(1, len(messages) + 1):
            current = render(k, False)
            if previous is not None and current is not None and current[: len(previous)] != previous:
                report.violations.append(
                    f"adding message {k - 1} ({messages[k - 1].role}) rewrites earlier tokens "
                    f"(first change at token {_first_diff(previous, current)})"
                )
            previous = current
            prompt = render(k - 1, True)
            if (
                messages[k - 1].role == "assistant"
                and prompt is not None
                and current is not None
                and current[: len(prompt)] != prompt
            ):
                report.violations.append(f"assistant message {k - 1} does not extend the generation prompt")
        for i, message in enumerate(messages):
            if message.role != "assistant" or not segments:
                continue
            body = self.encode_output(message)
            expected = self.render_generation_prompt() + body + self.close_output(body)
            if segments[i + 1] != expected:
                report.violations.append(f"assistant message {i} is not generation prompt + output + close")
        return report


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
