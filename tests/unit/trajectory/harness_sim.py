"""A simulated Claude-Code-shaped harness and a scripted engine that drive a TrajectoryTree.

The harness speaks Anthropic bodies through `from_anthropic`, echoes tool calls the way Claude
Code 2.1.332 does (input keys reordered into the tool schema's order, compact JSON), retries
calls, compacts (a summary request, then a fresh context that starts with "This session is being
continued…"), delegates to sub-agents (own system prompt, `x-claude-code-agent-id` header) and
abandons prepared calls. Every message carries a logical key, so the test can compute the tree the
execution *should* have independently of the implementation (`expected_paths`).
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gyre.trajectory import (
    CallMeta,
    PreparedCall,
    TrajectoryTree,
    from_anthropic,
    get_profile,
    template_for_family,
)
from gyre.trajectory.anthropic import to_anthropic_content

CALL_START, CALL_END, IM_END = 259, 260, 258
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a command.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        },
    }
]
MAIN_SYSTEM = "You are the main agent of a simulated harness."
SUB_SYSTEM = "You are an agent for Claude Code, simulated."
COMPACT = "CRITICAL: Respond with TEXT ONLY. Summarize the conversation in <analysis> and <summary>."
CONTINUED = "This session is being continued from a previous conversation. Summary: "


@dataclass
class Commit:
    output_ids: list[int]
    node_id: int
    deduplicated: bool
    leaf_key: tuple[str, ...]
    """Logical path (root key + message keys + output key) the output extends."""


@dataclass
class Agent:
    name: str
    system_prompt: str
    sub: bool
    messages: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    first_user: str = ""


class SimulatedExecution:
    """Drives one tree; `commits` and `requests` record what happened."""

    def __init__(self, seed: int, tool_prob: float = 0.7, text_len: tuple[int, int] = (8, 40)) -> None:
        self.rng = random.Random(seed)
        self.tree = TrajectoryTree(f"exec-{seed}", template_for_family("chatml"), get_profile("claude_code"))
        self.commits: list[Commit] = []
        self.tool_prob = tool_prob
        self.text_len = text_len
        self.num_requests = 0
        self._counter = 0
        self.main = self._new_agent("main", MAIN_SYSTEM, sub=False, task="Build the project.")
        self.pending_subs: list[tuple[Agent, str]] = []
        self.route: Callable[[np.ndarray], np.ndarray] | None = None
        """Routing replay: the MoE experts [n, L·k] of a call's n tokens; each commit records the rows
        of its prompt and output but the last, as an engine's `return_routed_experts` answers."""

    # -- actions ------------------------------------------------------------------------------

    def step(self, agent: Agent | None = None, retry: bool = False) -> None:
        """One model call of `agent`; with `retry`, a first output is discarded and the call repeated."""
        agent = agent or self.main
        if retry:
            self._call(agent, agent.messages)
        output_key, content = self._call(agent, agent.messages)
        self._continue(agent, output_key, content)

    def abandon(self, agent: Agent | None = None) -> None:
        """A call that is prepared and then rejected: nothing may change."""
        agent = agent or self.main
        before = (len(self.tree.nodes), {n: len(x.children) for n, x in self.tree.nodes.items()})
        self.tree.prepare(from_anthropic(self._body(agent, agent.messages), self._headers(agent)))
        after = (len(self.tree.nodes), {n: len(x.children) for n, x in self.tree.nodes.items()})
        assert before == after, "prepare changed the tree"

    def compact(self, agent: Agent | None = None) -> None:
        """Summary request (instruction appended to the last user message), then a fresh context."""
        agent = agent or self.main
        if not agent.messages or agent.messages[-1]["role"] != "user":
            return
        last = dict(agent.messages[-1])
        last["content"] = [*_blocks(last["content"]), {"type": "text", "text": COMPACT}]
        messages = [*agent.messages[:-1], last]
        key = self._key("compact")
        self._call(agent, messages, keys=[*agent.keys[:-1], key])
        agent.first_user = CONTINUED + self._text()
        agent.messages = [{"role": "user", "content": agent.first_user}]
        agent.keys = [self._key("continued")]

    def delegate(self) -> Agent:
        """Start a sub-agent (runs interleaved with the main agent until `finish_sub`)."""
        sub = self._new_agent(f"sub{self._counter}", SUB_SYSTEM, sub=True, task="Sub-task: " + self._text())
        return sub

    def finish_sub(self, sub: Agent) -> None:
        """The sub-agent answers; its answer becomes a tool result in the main context."""
        _, content = self._call(sub, sub.messages)
        text = "".join(b.get("text", "") for b in content if b["type"] == "text") or "done"
        self.main.messages.append({"role": "user", "content": text})
        self.main.keys.append(self._key("hand-back"))

    # -- expectations -------------------------------------------------------------------------

    def expected_nodes(self) -> int:
        """Distinct logical prefixes: the node count a correct tree has."""
        prefixes = {c.leaf_key[:i] for c in self.commits for i in range(1, len(c.leaf_key) + 1)}
        return len(prefixes)

    # -- internals ----------------------------------------------------------------------------

    def _new_agent(self, name: str, system: str, sub: bool, task: str) -> Agent:
        agent = Agent(name, system, sub, first_user=task)
        agent.messages = [{"role": "user", "content": task}]
        agent.keys = [self._key("task")]
        return agent

    def parallel_step(self, agents: list[Agent]) -> None:
        """Calls of several agents in flight at once: all prepared first, committed in reverse order."""
        prepared = [
            self.tree.prepare(from_anthropic(self._body(a, a.messages), self._headers(a))) for a in agents
        ]
        done = [
            self._call(a, a.messages, prepared=p)
            for a, p in reversed(list(zip(agents, prepared, strict=True)))
        ]
        for agent, (output_key, content) in zip(reversed(agents), done, strict=True):
            self._continue(agent, output_key, content)

    def _call(
        self,
        agent: Agent,
        messages: list[dict[str, Any]],
        keys: list[str] | None = None,
        prepared: PreparedCall | None = None,
    ) -> tuple[str, list[dict[str, Any]]]:
        self.num_requests += 1
        if prepared is None:
            prepared = self.tree.prepare(from_anthropic(self._body(agent, messages), self._headers(agent)))
        ids = self._sample()
        logprobs = [-self.rng.random() for _ in ids]
        routed = None
        if self.route is not None:
            routed = self.route(np.concatenate([prepared.input_ids, np.asarray(ids, np.int32)]))[:-1]
        result = self.tree.commit(
            prepared,
            ids,
            logprobs,
            CallMeta(request_id=str(self.num_requests), policy_version=3),
            routed_experts=routed,
        )
        assert result.output is not None
        output_key = f"out:{result.output_node.node_id}"
        root = f"root:{agent.system_prompt}"
        self.commits.append(
            Commit(
                ids,
                result.output_node.node_id,
                result.deduplicated,
                (root, *(keys if keys is not None else agent.keys), output_key),
            )
        )
        return output_key, to_anthropic_content(result.output)

    def _continue(self, agent: Agent, output_key: str, content: list[dict[str, Any]]) -> None:
        """Echo the output like Claude Code and add the next user turn."""
        echoed = [_echo(block) for block in content]
        agent.messages.append({"role": "assistant", "content": echoed})
        agent.keys.append(output_key)
        results = [
            {
                "type": "tool_result",
                "tool_use_id": b["id"],
                "content": "ok " + self._text(),
                "is_error": False,
            }
            for b in content
            if b["type"] == "tool_use"
        ]
        if results:
            agent.messages.append({"role": "user", "content": results})
        else:
            agent.messages.append({"role": "user", "content": "Continue. " + self._text()})
        agent.keys.append(self._key("user"))

    def _body(self, agent: Agent, messages: list[dict[str, Any]]) -> dict[str, Any]:
        billing = f"x-anthropic-billing-header: cc_version=2.1.332.{zlib.crc32(agent.first_user.encode()) % 4096:03x};"
        if agent.sub:
            billing += " cc_is_subagent=true;"
        system = [
            {"type": "text", "text": billing},
            {"type": "text", "text": agent.system_prompt, "cache_control": {"type": "ephemeral"}},
        ]
        return {
            "model": "m",
            "max_tokens": 1000,
            "stream": True,
            "system": system,
            "tools": TOOLS,
            "messages": messages,
        }

    def _headers(self, agent: Agent) -> dict[str, str]:
        return {"X-Claude-Code-Agent-Id": agent.name} if agent.sub else {}

    def _sample(self) -> list[int]:
        ids = list(self._text().encode())
        if self.rng.random() < self.tool_prob:
            payload = {
                "name": "Bash",
                "arguments": {"description": self._text(), "command": "echo " + self._text()},
            }
            ids += [CALL_START, *json.dumps(payload).encode(), CALL_END]
        return [*ids, IM_END]

    def _text(self) -> str:
        n = self.rng.randint(*self.text_len)
        return "".join(self.rng.choice("abcdefghij klmnop") for _ in range(n)).strip() or "x"

    def _key(self, kind: str) -> str:
        self._counter += 1
        return f"{kind}:{self._counter}"


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _echo(block: dict[str, Any]) -> dict[str, Any]:
    """Claude Code's echo: tool input keys in schema order, compact JSON."""
    if block["type"] != "tool_use":
        return dict(block)
    order = list(TOOLS[0]["input_schema"]["properties"])
    tool_input = {k: block["input"][k] for k in order if k in block["input"]}
    compact = json.loads(json.dumps(tool_input, separators=(",", ":")))
    return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": compact}


def run_script(
    seed: int, actions: list[str], route: Callable[[np.ndarray], np.ndarray] | None = None
) -> SimulatedExecution:
    """Run a list of actions: step, retry, abandon, compact, sub (starts or advances a sub-agent),
    parallel (a main and a sub-agent call in flight together), sub_compact, sub_end. `route`: record
    MoE routing (`SimulatedExecution.route`)."""
    sim = SimulatedExecution(seed)
    sim.route = route
    sub: Agent | None = None
    for action in actions:
        if action == "step":
            sim.step()
        elif action == "retry":
            sim.step(retry=True)
        elif action == "abandon":
            sim.abandon()
        elif action == "compact":
            sim.compact()
        elif action == "sub":
            if sub is None:
                sub = sim.delegate()
            sim.step(sub)
        elif action == "parallel":
            if sub is None:
                sub = sim.delegate()
            sim.parallel_step([sim.main, sub])
        elif action == "sub_compact" and sub is not None:
            sim.compact(sub)
        elif action == "sub_end" and sub is not None:
            sim.finish_sub(sub)
            sub = None
    return sim


def sampled_token_total(sim: SimulatedExecution) -> int:
    return sum(len(c.output_ids) for c in sim.commits if not c.deduplicated)


def node_sampled_ids(sim: SimulatedExecution, node_id: int) -> list[int]:
    node = sim.tree.nodes[node_id]
    assert node.sampled is not None
    return [int(x) for x in np.asarray(node.token_ids)[node.sampled]]
