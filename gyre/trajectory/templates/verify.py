"""Is a chat template append-only? Render conversations turn by turn and find where a render stops
being a token prefix of the next one; and what a stand-in template changes in the prompt the model
is sampled on.

TITO records each request's prompt as the previous request's prompt plus new tokens; a template
that rewrites earlier turns when a later one arrives (dropping earlier reasoning, moving tool
definitions, closing a grouped turn late) makes the recorded prefix differ from what the model
would be shown. `verify_template` renders a fixed suite of conversations — multi-turn with
thinking, parallel tool calls and results, a second user turn, an agent's tool loop, a sub-agent
with its own fresh system prompt — after every turn, and reports for each conversation the first
turn whose render does not extend the previous render (or that the template refuses to render),
and where the token streams part. `compare_last_turns` renders, for each conversation, the prompt
of its last assistant turn with two templates (a model's own and the registry's stand-in) and
reports where they differ.

    report = verify_template(template)        # `gyre model verify-template DIR` prints it as JSON
    report.ok, report.first_break
    compare_last_turns(shipped, verified)     # [LastTurn(conversation, equal, first_difference, detail)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gyre.trajectory.messages import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre.trajectory.templates.base import ChatTemplate, TemplateError

TOOLS = (
    ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}}),
    ToolSpec(
        "write_file",
        "Write a file.",
        {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
    ),
)


def _call(call_id: str, name: str, **arguments: str) -> ToolUseBlock:
    return ToolUseBlock(call_id, name, dict(arguments))


CONVERSATIONS: dict[str, tuple[str, tuple[ToolSpec, ...], tuple[Message, ...]]] = {
    "multi-turn with thinking and tools": (
        "You are a coding agent.",
        TOOLS,
        (
            Message.text("user", "Fix the failing test."),
            Message(
                "assistant",
                (
                    ThinkingBlock("I should look at the test first."),
                    TextBlock("Reading both files."),
                    _call("call_1", "read_file", path="test_add.py"),
                    _call("call_2", "read_file", path="add.py"),
                ),
            ),
            Message(
                "tool",
                (
                    ToolResultBlock("call_1", "assert add(2, 2) == 4"),
                    ToolResultBlock("call_2", "def add(a, b): return a - b"),
                ),
            ),
            Message(
                "assistant",
                (
                    ThinkingBlock("The operator is wrong."),
                    _call("call_3", "write_file", path="add.py", content="def add(a, b): return a + b"),
                ),
            ),
            Message("tool", (ToolResultBlock("call_3", "ok"),)),
            Message("assistant", (ThinkingBlock("Done."), TextBlock("Fixed: add now adds."))),
            Message.text("user", "Also add a docstring."),
            Message("assistant", (ThinkingBlock("Small change."), TextBlock("Added."))),
        ),
    ),
    "sub-agent with a fresh system prompt": (
        "You are a search sub-agent. Answer with file paths only.",
        TOOLS[:1],
        (
            Message.text("user", "Where is add defined?"),
            Message(
                "assistant", (ThinkingBlock("Check add.py."), _call("call_9", "read_file", path="add.py"))
            ),
            Message("tool", (ToolResultBlock("call_9", "def add(a, b): ...", is_error=False),)),
            Message("assistant", (TextBlock("add.py"),)),
        ),
    ),
    "agent tool loop with thinking": (
        "You are a coding agent.",
        TOOLS,
        (
            Message.text("user", "Make add.py pass its test."),
            Message(
                "assistant",
                (ThinkingBlock("Read the code first."), _call("call_4", "read_file", path="add.py")),
            ),
            Message("tool", (ToolResultBlock("call_4", "def add(a, b): return a - b"),)),
            Message(
                "assistant",
                (
                    ThinkingBlock("Subtraction: wrong operator."),
                    TextBlock("Fixing the operator."),
                    _call("call_5", "write_file", path="add.py", content="def add(a, b): return a + b"),
                ),
            ),
            Message("tool", (ToolResultBlock("call_5", "ok"),)),
            Message("assistant", (ThinkingBlock("Done; report."), TextBlock("add.py now adds."))),
        ),
    ),
    "plain chat": (
        "",
        (),
        (
            Message.text("user", "Hello"),
            Message("assistant", (TextBlock("Hi."),)),
            Message.text("user", "Bye"),
            Message("assistant", (TextBlock("Bye."),)),
        ),
    ),
}


@dataclass(frozen=True, slots=True)
class TurnCheck:
    index: int
    role: str
    append_only: bool
    """The render up to this turn starts with the render up to the previous turn."""
    first_difference: int | None = None
    """Token index where the two renders part (None when append-only)."""
    detail: str = ""


@dataclass(slots=True)
class ConversationReport:
    name: str
    turns: list[TurnCheck] = field(default_factory=list)
    error: str = ""

    @property
    def first_break(self) -> TurnCheck | None:
        return next((t for t in self.turns if not t.append_only), None)


@dataclass(slots=True)
class TemplateReport:
    conversations: list[ConversationReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.first_break is None and not c.error for c in self.conversations)

    @property
    def first_break(self) -> tuple[str, TurnCheck] | None:
        for c in self.conversations:
            if c.first_break is not None:
                return c.name, c.first_break
        return None


def check_conversation(
    template: ChatTemplate, name: str, system: str, tools: Sequence[ToolSpec], messages: Sequence[Message]
) -> ConversationReport:
    """Each turn's render against the last render that succeeded (a render the template refuses is a
    break of its own; the system turn with tools alone failing is the conversation's `error`)."""
    report = ConversationReport(name)
    previous, error = _render(template, system, tools, [])
    if error:
        report.error = f"the system turn and tools alone: {error}"
    for k, message in enumerate(messages):
        current, error = _render(template, system, tools, messages[: k + 1])
        if current is None:
            report.turns.append(TurnCheck(k, message.role, False, None, f"cannot render: {error}"))
            continue
        if previous is None or current[: len(previous)] == previous:
            report.turns.append(TurnCheck(k, message.role, True))
        else:
            at = _first_diff(previous, current)
            report.turns.append(
                TurnCheck(k, message.role, False, at, _describe(template, previous, current, at))
            )
        previous = current
    return report


def verify_template(template: ChatTemplate) -> TemplateReport:
    return TemplateReport(
        [check_conversation(template, name, *conversation) for name, conversation in CONVERSATIONS.items()]
    )


@dataclass(frozen=True, slots=True)
class LastTurn:
    """The prompt of a conversation's last assistant turn (what the model is sampled on), rendered by
    two templates."""

    conversation: str
    equal: bool
    first_difference: int | None = None
    """Token index where the two prompts part (None when equal, or when one cannot render)."""
    detail: str = ""


def compare_last_turns(reference: ChatTemplate, other: ChatTemplate) -> list[LastTurn]:
    """For every conversation of the suite: does `other` render its last assistant turn's prompt as
    `reference` does? (Both templates must share a tokenizer.)"""
    out = []
    for name, (system, tools, messages) in CONVERSATIONS.items():
        last = max(i for i, m in enumerate(messages) if m.role == "assistant")
        ours, error = _render(other, system, tools, messages[:last], add_generation_prompt=True)
        theirs, their_error = _render(reference, system, tools, messages[:last], add_generation_prompt=True)
        if ours is None or theirs is None:
            detail = f"cannot render: {their_error}" if theirs is None else f"stand-in cannot render: {error}"
            out.append(LastTurn(name, False, None, detail))
        elif ours == theirs:
            out.append(LastTurn(name, True))
        else:
            at = _first_diff(theirs, ours)
            out.append(LastTurn(name, False, at, _describe(other, theirs, ours, at, ("shipped", "auto"))))
    return out


def _render(
    template: ChatTemplate,
    system: str,
    tools: Sequence[ToolSpec],
    messages: Sequence[Message],
    add_generation_prompt: bool = False,
) -> tuple[list[int] | None, str]:
    try:
        return template.render_conversation(system, tools, messages, add_generation_prompt), ""
    except TemplateError as e:
        return None, str(e)


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _describe(
    template: ChatTemplate,
    before: Sequence[int],
    after: Sequence[int],
    at: int,
    labels: tuple[str, str] = ("before", "after"),
) -> str:
    """A few tokens of text either side of the parting point, as the two renders have them."""
    tokenizer = getattr(template, "tokenizer", None)
    if tokenizer is None:
        return ""
    lo = max(0, at - 8)
    was = tokenizer.decode(list(before[lo : at + 12]))
    now = tokenizer.decode(list(after[lo : at + 12]))
    return f"{labels[0]}: {was!r} / {labels[1]}: {now!r}"
