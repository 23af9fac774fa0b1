"""The real Claude Code CLI (2.1.332, unmodified, offline) against a scripted model endpoint that
records every call in a TrajectoryTree: the tree survives Claude Code's echo of tool calls (keys
reordered into schema order) without a spurious branch, and `gyre trace replay` reads its captures.

Skipped only on a developer machine without the binary (`npm install` in the repo root, or
GYRE_CLAUDE_BIN=/path/to/claude); in CI (CI set) a missing binary fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli import app
from gyre.trajectory import (
    CallMeta,
    PreparedCall,
    TrajectoryTree,
    from_anthropic,
    get_profile,
    template_for_family,
)
from gyre.trajectory.anthropic import to_anthropic_content
from gyre.trajectory.tree import CommitResult
from tests.support.anthropic_capture import CaptureServer, Reply

pytestmark = pytest.mark.cli
REPO = Path(__file__).resolve().parents[3]
IM_END, CALL_START, CALL_END = 258, 259, 260
BASH_CALL = '{"name": "Bash", "arguments": {"description": "Create file", "command": "echo hi > hello.txt"}}'


@pytest.fixture(scope="module")
def claude() -> Path:
    for candidate in (
        os.environ.get("GYRE_CLAUDE_BIN"),
        REPO / "node_modules/.bin/claude",
        shutil.which("claude"),
    ):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    if os.environ.get("CI"):
        pytest.fail("Claude Code CLI not installed (CI installs @anthropic-ai/claude-code@2.1.332 with npm)")
    pytest.skip("Claude Code CLI not installed; run `npm install` in the repo root or set GYRE_CLAUDE_BIN")


class RecordingModel:
    """Answers Claude Code's calls from scripts of output texts per leaf class (main, sub_agent,
    main_summary, ...) and records every call in a tree. A text may carry a reported input-token
    count (`(text, tokens)`): a huge one makes Claude Code compact before its next call."""

    def __init__(self, outputs: Mapping[str, list[str | tuple[str, int]]]) -> None:
        self.tree = TrajectoryTree("cli", template_for_family("chatml"), get_profile("claude_code"))
        self.outputs = {k: list(v) for k, v in outputs.items()}
        self.prepared: list[PreparedCall] = []
        self.results: list[CommitResult] = []
        self.output_ids: list[list[int]] = []

    def __call__(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> Reply:
        prepared = self.tree.prepare(from_anthropic(body, headers))
        queue = self.outputs.get(str(prepared.leaf_class))
        if not body.get("tools") or not queue:
            return Reply(text="ok")  # an auxiliary call (not part of this script)
        item = queue.pop(0)
        text, input_tokens = item if isinstance(item, tuple) else (item, 100)
        ids = []
        for i, part in enumerate(text.split("<tool_call>")):
            call, _, rest = part.rpartition("</tool_call>") if i else ("", "", part)
            ids += [CALL_START, *call.encode(), CALL_END] if call else []
            ids += list(rest.encode())
        ids.append(IM_END)
        result = self.tree.commit(
            prepared, ids, [-0.25] * len(ids), CallMeta(request_id=str(len(self.results)))
        )
        assert result.output is not None
        self.prepared.append(prepared)
        self.results.append(result)
        self.output_ids.append(ids)
        return Reply(content=tuple(to_anthropic_content(result.output)), input_tokens=input_tokens)


def _run(claude: Path, server: CaptureServer, prompt: str, tmp_path: Path) -> dict[str, Any]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = dict(
        os.environ,
        HOME=str(home),
        ANTHROPIC_BASE_URL=server.base_url,
        ANTHROPIC_API_KEY="k",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        IS_SANDBOX="1",
    )
    proc = subprocess.run(
        [str(claude), "-p", prompt, "--output-format", "json", "--dangerously-skip-permissions"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout), workdir=str(work))


def _replay(server: CaptureServer, path: Path) -> dict[str, Any]:
    server.write_jsonl(path)
    result = CliRunner().invoke(app, ["trace", "replay", "--profile", "claude_code", str(path)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_text_answer_is_recorded_and_replayed(claude: Path, tmp_path: Path) -> None:
    model = RecordingModel({"main": ["Hello from the model."]})
    with CaptureServer(model) as server:
        out = _run(claude, server, "Say hello", tmp_path)
    assert out["result"] == "Hello from the model."
    leaf = model.results[0].output_node
    assert leaf.token_ids[leaf.sampled].tolist() == model.output_ids[0]
    assert model.prepared[0].agent_kind == "main" and model.prepared[0].request_kind == "task"
    summary = _replay(server, tmp_path / "capture.jsonl")
    assert summary["roots"] == {"main": 1, "sub": 0}
    assert summary["leaves"]["main"] == 1 and summary["admitted"]["trajectories"] == 1


def test_bash_tool_call_echo_does_not_branch(claude: Path, tmp_path: Path) -> None:
    model = RecordingModel(
        {"main": [f"I will create it.\n<tool_call>{BASH_CALL}</tool_call>", "Done: created hello.txt."]}
    )
    with CaptureServer(model) as server:
        out = _run(claude, server, "Create hello.txt containing hi", tmp_path)
    assert out["result"] == "Done: created hello.txt."
    assert (Path(out["workdir"]) / "hello.txt").read_text().strip() == "hi"
    first, second = model.results
    # Claude Code 2.1.332 echoes the input with keys in the tool schema's order, not as emitted...
    echoed = [
        b
        for m in server.records[1]["body"]["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert list(echoed[0]["input"]) == ["command", "description"]
    assert echoed[0]["id"] == first.output.tool_calls[0].id  # type: ignore[union-attr]
    # ...and the tree still matches the recorded output: no spurious branch.
    assert first.output_node in model.prepared[1].matched
    assert len(first.output_node.child_nodes) == 1
    assert len(model.tree.leaves()) == 1 and model.tree.leaves()[0] is second.output_node
    for result, ids in zip(model.results, model.output_ids, strict=True):
        assert result.output_node.token_ids[result.output_node.sampled].tolist() == ids
    summary = _replay(server, tmp_path / "capture.jsonl")
    assert summary["requests"] == 2 and summary["roots"] == {"main": 1, "sub": 0}
    assert summary["leaves"] == {"main": 1, "main_summary": 0, "sub_agent": 0, "sub_agent_summary": 0}


def test_sub_agent_and_compaction_map_to_roots_and_leaf_classes(claude: Path, tmp_path: Path) -> None:
    agent = json.dumps(
        {
            "name": "Agent",
            "arguments": {
                "description": "List files",
                "prompt": "List the files",
                "subagent_type": "general-purpose",
                "run_in_background": False,
            },
        }
    )
    ls = json.dumps({"name": "Bash", "arguments": {"description": "List files", "command": "ls"}})
    model = RecordingModel(
        {
            "main": [
                f"Delegating.<tool_call>{agent}</tool_call>",
                (f"Now writing.<tool_call>{BASH_CALL}</tool_call>", 995_000),
                "All done.",
            ],
            "sub_agent": [f"<tool_call>{ls}</tool_call>", "The directory is empty."],
            "main_summary": [
                "<analysis>a</analysis>\n<summary>Delegated listing; writing hello.txt.</summary>"
            ],
        }
    )
    with CaptureServer(model) as server:
        out = _run(claude, server, "Delegate listing the files, then create hello.txt", tmp_path)
    assert out["result"] == "All done."
    assert not any(model.outputs.values()), f"unused script: {model.outputs}"
    classes = [str(p.leaf_class) for p in model.prepared]
    assert classes == ["main", "sub_agent", "sub_agent", "main", "main_summary", "main"]
    tree = model.tree
    assert {str(r.agent_kind) for r in tree.roots.values()} == {"main", "sub"} and len(tree.roots) == 2
    # Every continuation extended the previous output of its agent (no spurious branch) ...
    assert model.results[0].output_node in model.prepared[3].matched
    assert model.results[1].output_node in model.prepared[2].matched
    # ... the compaction request branched off the main path, and the continuation after it starts
    # under the same root (the billing line that changed is volatile).
    summary_leaf = model.results[4].output_node
    assert summary_leaf.is_leaf and str(summary_leaf.leaf_class) == "main_summary"
    assert model.prepared[5].root is not None and model.prepared[5].root_key == model.prepared[0].root_key
    assert model.prepared[5].num_matched_messages == 0
    assert sorted(str(leaf.leaf_class) for leaf in tree.leaves()) == [
        "main",
        "main",
        "main_summary",
        "sub_agent",
    ]
    summary = _replay(server, tmp_path / "capture.jsonl")
    assert summary["roots"] == {"main": 1, "sub": 1}
    assert summary["leaves"] == {"main": 2, "main_summary": 1, "sub_agent": 1, "sub_agent_summary": 0}
