"""Executions for `gyre bench tree-train`, in two families, scaled to the embedded model's context.

- `appendix_c`: the shape of the paper's Appendix C case (and of `gyre bench tree`): a main agent
  and a sub-agent with its own system prompt, each compacting once (a summary leaf on the long
  pre-compaction prefix, then a fresh context under the same root), with retried calls (the first
  output of a retried call stays a leaf). Recorded call by call with `prepare` + `commit`, the
  embedded template and the `generic` profile (agents and summaries marked by headers).
- `replay`: Claude-Code-shaped capture sessions — Anthropic envelopes as
  tests/support/anthropic_capture.py writes them: billing header, `cc_is_subagent` and
  `x-claude-code-agent-id` for the sub-agent, the "CRITICAL: Respond with TEXT ONLY" compaction
  turn and the "This session is being continued" context after it, tool calls echoed with their
  input keys re-ordered, and retries (one request sent twice, two responses) — rebuilt into a tree
  by `gyre.trajectory.replay` with the `claude_code` profile, as `gyre trace replay` does.

The embedded template is byte-level, so a call of `result_tokens` + `output_tokens` is about that
many tokens; the defaults (26 and 22 calls per agent, times `scale`) keep every root-to-leaf path
under the default model's 4096 positions.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np

from gyre.trajectory import CallMeta, Message, ModelRequest, TrajectoryTree, get_profile, template_for_family
from gyre.trajectory.messages import Api, ToolResultBlock, ToolSpec, ToolUseBlock
from gyre.trajectory.replay import CapturedCall, replay

IM_END, CALL_START, CALL_END = 258, 259, 260
_TOOLS = (
    ToolSpec(
        "Bash", "Run a shell command.", {"type": "object", "properties": {"command": {"type": "string"}}}
    ),
)
_COMPACT = "CRITICAL: Respond with TEXT ONLY. Summarize the conversation."
_CONTINUED = "This session is being continued from a previous conversation. Summary: "


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     \n") for _ in range(n))


class _Agent:
    """One agent's conversation, recorded call by call into a shared tree."""

    def __init__(
        self, tree: TrajectoryTree, system: str, rng: random.Random, agent: str, sizes: tuple[int, int]
    ):
        self.tree, self.system, self.rng, self.agent = tree, system, rng, agent
        self.result_tokens, self.output_tokens = sizes
        self.messages: list[Message] = [Message.text("user", "Task: " + _text(rng, 120))]

    def call(self, keep: bool = True, summary: bool = False) -> None:
        headers = {"x-gyre-agent": self.agent, "x-gyre-request": "summary" if summary else "task"}
        request = ModelRequest(Api.ANTHROPIC, (self.system,), tuple(self.messages), _TOOLS, headers=headers)
        prepared = self.tree.prepare(request)
        payload = json.dumps(
            {"name": "Bash", "arguments": {"command": _text(self.rng, 30).replace("\n", " ")}}
        )
        text = _text(self.rng, max(1, self.output_tokens - len(payload) - 3))
        ids = [*text.encode(), CALL_START, *payload.encode(), CALL_END, IM_END]
        logprobs = -np.asarray([self.rng.random() for _ in ids], dtype=np.float32)
        result = self.tree.commit(prepared, ids, logprobs, CallMeta(request_id="c", policy_version=1))
        if keep and result.output is not None:
            message = result.output.to_message()
            echoed = tuple(
                ToolUseBlock(b.id, b.name, dict(reversed(list(b.input.items()))))
                if isinstance(b, ToolUseBlock)
                else b
                for b in message.blocks
            )
            call_id = result.output.tool_calls[0].id
            self.messages += [
                message.replace_blocks(echoed),
                Message("user", (ToolResultBlock(call_id, _text(self.rng, self.result_tokens)),)),
            ]

    def compact(self) -> None:
        self.call(keep=False, summary=True)
        self.messages = [Message.text("user", _CONTINUED + _text(self.rng, 200))]


def appendix_c_execution(
    seed: int, *, scale: float = 1.0, result_tokens: int = 110, output_tokens: int = 70
) -> TrajectoryTree:
    """Main agent and a sub-agent, each compacting once, with retries (4 in the main agent, 2 in the
    sub-agent), at the fractions of the run where `gyre bench tree`'s Appendix C tree has them (each
    retry moved by up to 3% of the run per seed)."""
    rng = random.Random(seed)
    tree = TrajectoryTree(f"appendix-c-{seed}", template_for_family("chatml"), get_profile("generic"))
    sizes = (result_tokens, output_tokens)
    main = _Agent(tree, "You are the main agent. " + _text(rng, 300), rng, "main", sizes)
    sub = _Agent(tree, "You are a sub-agent. " + _text(rng, 200), rng, "sub", sizes)
    n = round(26 * scale)

    def at(fraction: float, jitter: bool = False) -> int:
        return round(n * (fraction + (rng.uniform(-0.03, 0.03) if jitter else 0.0)))

    main_retries = {at(f, jitter=True) for f in (40 / 330, 120 / 330, 200 / 330, 290 / 330)}
    sub_retries = {at(f, jitter=True) for f in (100 / 330, 250 / 330)}
    main_compaction, sub_compaction = at(168 / 330), at(253 / 330)
    sub_span = range(at(60 / 330), at(320 / 330))
    for i in range(n):
        if i in main_retries:
            main.call(keep=False)
        main.call()
        if i == main_compaction:
            main.compact()
        if i in sub_span:
            if i in sub_retries:
                sub.call(keep=False)
            sub.call()
            if i == sub_compaction:
                sub.compact()
    tree.close()
    return tree


# -- replayed captures ---------------------------------------------------------------------------

_BILLING = "x-anthropic-billing-header: cc_version=2.1.332.abc; cc_entrypoint=sdk-cli;"
_CAPTURE_TOOLS = [
    {
        "name": "Bash",
        "description": "Run.",
        "input_schema": {"type": "object", "properties": {"command": {}, "description": {}}},
    }
]


class _CapturedAgent:
    """One agent of a captured session: its history as the harness resends it."""

    def __init__(self, rng: random.Random, sub: bool, counter: list[int], sizes: tuple[int, int]) -> None:
        self.rng, self.sub, self.counter = rng, sub, counter
        self.result_tokens, self.output_tokens = sizes
        billing = _BILLING + (" cc_is_subagent=true;" if sub else "")
        prompt = "You are an agent for Claude Code." if sub else "You are the main agent."
        self.system = [
            {"type": "text", "text": billing},
            {"type": "text", "text": prompt + " " + _text(rng, 200)},
        ]
        self.headers = {"x-claude-code-agent-id": "agent1"} if sub else {}
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "Task: " + _text(rng, 120)}]

    def _envelope(self, messages: list[dict[str, Any]], response: list[dict[str, Any]]) -> dict[str, Any]:
        body = {
            "model": "m",
            "max_tokens": 1000,
            "stream": True,
            "system": self.system,
            "tools": _CAPTURE_TOOLS,
            "messages": messages,
        }
        return {
            "headers": self.headers,
            "body": body,
            "response": {"role": "assistant", "content": response},
            "path": "/v1/messages",
        }

    def _reply(self) -> list[dict[str, Any]]:
        self.counter[0] += 1
        text = _text(self.rng, max(1, self.output_tokens - 60))
        tool_input = {"description": _text(self.rng, 12), "command": _text(self.rng, 24)}
        return [
            {"type": "text", "text": text},
            {"type": "tool_use", "id": f"toolu_{self.counter[0]}", "name": "Bash", "input": tool_input},
        ]

    def turn(self, retry: bool = False) -> list[dict[str, Any]]:
        """Envelopes of one call (two with `retry`: the first response is discarded)."""
        out = [self._envelope(list(self.messages), self._reply())] if retry else []
        reply = self._reply()
        out.append(self._envelope(list(self.messages), reply))
        call = reply[1]
        echoed = dict(
            call, input={"command": call["input"]["command"], "description": call["input"]["description"]}
        )
        result = {
            "type": "tool_result",
            "tool_use_id": call["id"],
            "content": _text(self.rng, self.result_tokens),
        }
        self.messages += [
            {"role": "assistant", "content": [reply[0], echoed]},
            {"role": "user", "content": [result]},
        ]
        return out

    def compact(self) -> list[dict[str, Any]]:
        last = self.messages[-1]
        content = [*last["content"], {"type": "text", "text": _COMPACT}]
        envelope = self._envelope(
            [*self.messages[:-1], {"role": "user", "content": content}],
            [{"type": "text", "text": "<summary>" + _text(self.rng, 200) + "</summary>"}],
        )
        self.messages = [{"role": "user", "content": _CONTINUED + _text(self.rng, 200)}]
        return [envelope]


def replay_execution(
    seed: int, *, scale: float = 1.0, result_tokens: int = 110, output_tokens: int = 100
) -> TrajectoryTree:
    """A captured Claude-Code-shaped session (main + sub-agent, compactions, retries) replayed into a tree."""
    rng = random.Random(seed)
    counter = [0]
    sizes = (result_tokens, output_tokens)
    main, sub = _CapturedAgent(rng, False, counter, sizes), _CapturedAgent(rng, True, counter, sizes)
    n = round(22 * scale)
    envelopes: list[dict[str, Any]] = []
    for i in range(n):
        envelopes += main.turn(retry=i in {n // 6, n // 3, (3 * n) // 4})
        if i == n // 2:
            envelopes += main.compact()
        if n // 4 <= i < n - 2:
            envelopes += sub.turn(retry=i == n // 2)
            if i == (2 * n) // 3:
                envelopes += sub.compact()
    calls = [
        CapturedCall(e["body"], e["headers"], e["response"], e["path"], f"capture:{k}")
        for k, e in enumerate(envelopes)
    ]
    tree = replay(
        calls, template_for_family("chatml"), get_profile("claude_code"), execution_id=f"replay-{seed}"
    )
    tree.close()
    return tree


FAMILIES = {"appendix_c": appendix_c_execution, "replay": replay_execution}
