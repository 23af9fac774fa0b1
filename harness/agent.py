"""The demo harness's agent loop: model call → tools → results → …, with compaction and
sub-agent delegation, the behaviours of a long-horizon harness that the trajectory tree records.

- **Compaction.** Before each call the agent compares its context (the larger of the request's
  byte size — the embedded model's token count — and the tokens the last response reported) with
  its budget. Over it, the agent sends a summary request (`x-gyre-request: summary`: the history
  plus a summary instruction) and continues from a fresh history that starts from the summary.
- **Delegation.** The `delegate` tool runs a sub-agent with its own system prompt, its own tools
  (the workspace tools) and its own context; its calls carry `x-gyre-agent: sub`; its final text
  is the tool result.
- **Retries** of failed calls live in the client (harness/client.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anthropic.types import Message

from harness import prompts
from harness.client import ModelClient
from harness.latency import ToolLatency
from harness.tools import ToolResult, execute, tool_specs


@dataclass(slots=True)
class AgentReport:
    """What one agent (main or sub) did."""

    final_text: str = ""
    turns: int = 0
    compactions: int = 0
    tool_calls: int = 0
    sub_agents: int = 0
    stopped: str = "end_turn"
    """`end_turn` (answered without tools), `max_turns`, or the last stop reason."""
    tool_counts: dict[str, int] = field(default_factory=dict)


def assistant_blocks(response: Message) -> list[dict[str, Any]]:
    """The response's content as request blocks (the history the harness sends back)."""
    blocks: list[dict[str, Any]] = []
    for block in response.content:
        if block.type == "text":
            blocks.append({"type": "text", "text": block.text})
        elif block.type == "tool_use":
            blocks.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
        elif block.type == "thinking":
            blocks.append({"type": "thinking", "thinking": block.thinking, "signature": block.signature})
    return blocks


def response_text(response: Message) -> str:
    return "".join(block.text for block in response.content if block.type == "text")


class Agent:
    """One agent: the main one (`sub_agent=False`) or a delegated sub-agent."""

    def __init__(
        self,
        client: ModelClient,
        workspace: Path,
        *,
        tools: tuple[str, ...],
        sub_agent: bool = False,
        context_budget_tokens: int = 16_000,
        max_turns: int = 16,
        latency: ToolLatency | None = None,
    ) -> None:
        if context_budget_tokens < 256:
            raise ValueError(f"context budget must be at least 256 tokens; got {context_budget_tokens}")
        self.client = client
        self.workspace = workspace.resolve()
        self.sub_agent = sub_agent
        self.system = prompts.SUB_SYSTEM if sub_agent else prompts.MAIN_SYSTEM
        self.tool_names = tuple(t for t in tools if not (sub_agent and t == "delegate"))
        self.tools = tool_specs(self.tool_names)
        self.context_budget_tokens = context_budget_tokens
        self.max_turns = max_turns
        self.latency = latency or ToolLatency()
        self.report = AgentReport()
        self._last_usage_tokens = 0

    def run(self, task: str) -> AgentReport:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for _ in range(self.max_turns):
            if self._context_tokens(messages) > self.context_budget_tokens:
                messages = self._compact(task, messages)
            response = self.client.create(self.system, self.tools, messages, sub_agent=self.sub_agent)
            self.report.turns += 1
            self._last_usage_tokens = response.usage.input_tokens + response.usage.output_tokens
            messages.append({"role": "assistant", "content": assistant_blocks(response)})
            calls = [b for b in response.content if b.type == "tool_use"]
            if not calls:
                self.report.final_text = response_text(response)
                self.report.stopped = response.stop_reason or "end_turn"
                return self.report
            results = [self._tool_result(c.id, c.name, c.input) for c in calls]
            messages.append({"role": "user", "content": results})
        self.report.stopped = "max_turns"
        return self.report

    def _context_tokens(self, messages: list[dict[str, Any]]) -> int:
        request_bytes = len(json.dumps([self.system, self.tools, messages], ensure_ascii=False).encode())
        return max(request_bytes, self._last_usage_tokens)

    def _compact(self, task: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        last = messages[-1]
        assert last["role"] == "user", "compaction happens before a call, after a user turn"
        content = last["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        request = [
            *messages[:-1],
            {"role": "user", "content": [*blocks, {"type": "text", "text": prompts.SUMMARY_INSTRUCTION}]},
        ]
        response = self.client.create(
            self.system, self.tools, request, sub_agent=self.sub_agent, summary=True
        )
        self.report.compactions += 1
        self._last_usage_tokens = 0
        print(f"harness: compacted context ({'sub' if self.sub_agent else 'main'})", file=sys.stderr)
        return [{"role": "user", "content": prompts.resumed_prompt(task, response_text(response))}]

    def _tool_result(self, call_id: str, name: str, args: object) -> dict[str, Any]:
        self.report.tool_calls += 1
        self.report.tool_counts[name] = self.report.tool_counts.get(name, 0) + 1
        self.latency.sleep()
        if name == "delegate" and "delegate" in self.tool_names:
            result = self._delegate(args)
        elif name in self.tool_names:
            result = execute(self.workspace, name, args)
        else:
            result = ToolResult(f"unknown tool {name!r}", is_error=True)
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id, "content": result.content}
        if result.is_error:
            block["is_error"] = True
        return block

    def _delegate(self, args: object) -> ToolResult:
        task = args.get("task") if isinstance(args, dict) else None
        if not isinstance(task, str) or not task:
            return ToolResult("argument 'task' must be a non-empty string", is_error=True)
        sub = Agent(
            self.client,
            self.workspace,
            tools=self.tool_names,
            sub_agent=True,
            context_budget_tokens=self.context_budget_tokens,
            max_turns=self.max_turns,
            latency=self.latency,
        )
        report = sub.run(task)
        self.report.sub_agents += 1
        return ToolResult(report.final_text or f"sub-agent stopped ({report.stopped}) without a report")
