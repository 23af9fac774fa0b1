"""Teacher transcripts for the warm start, rendered exactly as the proxy will see them.

A mostly-right teacher solves demo tasks through the demo harness's protocol: per part, one
`write_file` call (80% right, 10% a wrong answer, 10% a malformed call that the proxy's tool-call
parser rejects, which ends the execution), then "Done.". Each transcript is rendered along the
path of a live model call: the demo harness's system prompt and tool definitions in an Anthropic
Messages body → the trajectory processor's Anthropic converter → the `generic` harness profile →
the demo model's chat template (`chatml`) → token ids, with the assistant outputs (what the engine
samples) as the training targets.

    rng = random.Random(0)
    ids, targets = render_transcript(teacher_body(task, rng))
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gyre.tasks import Task
from gyre.trajectory.anthropic import from_anthropic
from gyre.trajectory.messages import Message, ToolUseBlock
from gyre.trajectory.profiles import PROFILES
from gyre.trajectory.templates import ChatTemplate, template_for_family
from harness import prompts
from harness.tools import DEFAULT_TOOLS, tool_specs

RIGHT, WRONG, MALFORMED = 0.8, 0.1, 0.1
DONE = "Done."
_CHECK = re.compile(r"^([^=]+)=(.*)$")


@dataclass(frozen=True, slots=True)
class Transcript:
    body: dict[str, Any]
    """The last Anthropic request of the execution, plus the final output as an assistant turn."""
    malformed_output: str | None = None
    """Payload of a malformed final call (kept as raw ids: no Anthropic block can carry it)."""


def answers(task: Task) -> list[tuple[str, str]]:
    """(file, expected content) pairs from a demo task's verifier arguments."""
    found = [_CHECK.match(arg) for arg in task.verifier.argv[3:]]
    return [(m.group(1), m.group(2)) for m in found if m is not None]


def _wrong(answer: str, rng: random.Random) -> str:
    choices = [str(n) for n in range(19) if str(n) != answer]
    return rng.choice(choices)


def teacher_body(task: Task, rng: random.Random) -> Transcript:
    """One execution of the teacher on `task`, as the body of its final request plus the answer."""
    tools = task.tools or DEFAULT_TOOLS
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    for i, (path, answer) in enumerate(answers(task)):
        roll = rng.random()
        content = answer if roll < RIGHT else _wrong(answer, rng)
        arguments = {"path": path, "content": content}
        if roll >= RIGHT + WRONG:
            broken = '{"name":"write_file","arguments":' + f'{{"path":"{path}","content":"{content}"}}'
            return Transcript(_body(messages, tools), malformed_output=broken)  # no closing brace
        call_id = f"toolu_{i:02d}"
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call_id, "name": "write_file", "input": arguments}],
            }
        )
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "ok"}]}
        )
    messages.append({"role": "assistant", "content": [{"type": "text", "text": DONE}]})
    return Transcript(_body(messages, tools))


def _body(messages: list[dict[str, Any]], tools: Sequence[str]) -> dict[str, Any]:
    return {
        "model": "gyre-embedded",
        "max_tokens": 512,
        "system": prompts.MAIN_SYSTEM,
        "tools": tool_specs(tools),
        "messages": messages,
    }


def render_transcript(
    transcript: Transcript, template: ChatTemplate | None = None
) -> tuple[list[int], list[bool]]:
    """Token ids and target mask (True on engine-sampled output tokens) along the proxy's path."""
    template = template or template_for_family("chatml")
    request = from_anthropic(transcript.body, {})
    system = PROFILES["generic"].classify(request).system
    ids = template.render_system(system, request.tools)
    targets = [False] * len(ids)
    previous: Message | None = None
    for message in request.messages:
        if message.role == "assistant":
            prompt, output = template.render_generation_prompt(), template.encode_output(message)
            ids += prompt + output
            targets += [False] * len(prompt) + [True] * len(output)
        else:
            segment = template.render_message(message, previous)
            ids += segment
            targets += [False] * len(segment)
        previous = message
    if transcript.malformed_output is not None:
        prompt = template.render_generation_prompt()
        # A malformed call is text the parser rejects; rendered as the engine would have emitted it.
        output = template.encode_output(
            Message.text("assistant", f"<tool_call>{transcript.malformed_output}</tool_call>")
        )
        ids += prompt + output
        targets += [False] * len(prompt) + [True] * len(output)
    return ids, targets


def call_payload(message: Message) -> str:
    """The payload of an assistant message's first tool call as the template renders it."""
    call = next(b for b in message.blocks if isinstance(b, ToolUseBlock))
    return call.payload()
