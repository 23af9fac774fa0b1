"""`gyre trace replay` on synthetic captures of each API (fixtures written here, not Anthropic's text)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from app.cli import app

BILLING = {
    "type": "text",
    "text": "x-anthropic-billing-header: cc_version=2.1.332.abc; cc_entrypoint=sdk-cli;",
}
MAIN = [BILLING, {"type": "text", "text": "You are the main agent."}]
SUB = [
    {"type": "text", "text": BILLING["text"] + " cc_is_subagent=true;"},
    {"type": "text", "text": "You are an agent for Claude Code."},
]
TOOLS = [
    {
        "name": "Bash",
        "description": "Run.",
        "input_schema": {"type": "object", "properties": {"command": {}, "description": {}}},
    }
]


def _envelope(
    system: list[dict[str, str]],
    messages: list[dict[str, Any]],
    response: list[dict[str, Any]] | None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    body = {
        "model": "m",
        "max_tokens": 10,
        "stream": True,
        "system": system,
        "tools": TOOLS,
        "messages": messages,
    }
    env: dict[str, Any] = {"headers": headers or {}, "body": body}
    if response is not None:
        env["response"] = {"role": "assistant", "content": response}
    return env


def _claude_session() -> list[dict[str, Any]]:
    call = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "Bash",
        "input": {"description": "list", "command": "ls"},
    }
    echoed = dict(call, input={"command": "ls", "description": "list"})
    u0 = {"role": "user", "content": [{"type": "text", "text": "reminder"}, {"type": "text", "text": "task"}]}
    a0 = {"role": "assistant", "content": [{"type": "text", "text": "Looking."}, echoed]}
    r0 = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]}
    compact = {
        "role": "user",
        "content": [*r0["content"], {"type": "text", "text": "CRITICAL: Respond with TEXT ONLY."}],
    }
    cont = {"role": "user", "content": "This session is being continued from a previous conversation. S."}
    return [
        _envelope(MAIN, [u0], [{"type": "text", "text": "Looking."}, call]),
        _envelope(
            SUB,
            [{"role": "user", "content": "sub task"}],
            [{"type": "text", "text": "sub answer"}],
            {"x-claude-code-agent-id": "agent1"},
        ),
        _envelope(MAIN, [u0, a0, r0], [{"type": "text", "text": "Done."}]),
        _envelope(MAIN, [u0, a0, compact], [{"type": "text", "text": "<summary>S.</summary>"}]),
        _envelope(MAIN, [cont], None),
    ]


def _replay(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["trace", "replay", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_replay_claude_code_session(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in _claude_session()))
    summary = _replay(["--profile", "claude_code", str(path)])
    assert summary["requests"] == 5
    assert summary["roots"] == {"main": 1, "sub": 1}
    assert summary["leaves"] == {"main": 1, "main_summary": 1, "sub_agent": 1, "sub_agent_summary": 0}
    # root, u0, a0, r0, "Done.", compaction turn, summary; sub root, task, answer. The last request has
    # no response: nothing of it is recorded.
    assert summary["nodes"] == 10
    assert summary["expanded_tokens"] > summary["unique_tokens"]
    assert summary["admitted"]["trajectories"] == 3
    assert summary["admitted"]["by_class"] == {"main": 1, "main_summary": 1, "sub_agent": 1}
    assert summary["admitted"]["targets"] == summary["sampled_tokens"]


def test_replay_bodies_without_responses_and_other_apis(tmp_path: Path) -> None:
    bodies = [e["body"] for e in _claude_session()]
    files = []
    for i, body in enumerate(bodies):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps(body))
    summary = _replay(["--profile", "claude_code", *map(str, files)])
    assert summary["leaves"]["main"] == 1 and summary["leaves"]["main_summary"] == 0  # histories only
    chat = [
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]},
        {
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ]
        },
    ]
    (tmp_path / "chat.json").write_text(json.dumps(chat))
    assert _replay([str(tmp_path / "chat.json")])["leaves"]["main"] == 1
    responses = {
        "instructions": "I",
        "input": [
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c1", "name": "exec", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
    }
    (tmp_path / "r.json").write_text(json.dumps(responses))
    assert _replay(["--profile", "codex", str(tmp_path / "r.json")])["sampled_tokens"] > 0


def test_replay_reports_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}))
    result = CliRunner().invoke(app, ["trace", "replay", "--profile", "claude_code", str(bad)])
    assert result.exit_code == 2 and "image" in result.output
