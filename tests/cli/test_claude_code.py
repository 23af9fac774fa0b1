"""The real Claude Code CLI (2.1.332, unmodified, offline) against the proxy with a scripted engine.

It always sends `POST /v1/messages?beta=true` with `stream: true`. Scenarios: (a) a text answer;
(b) a `Bash` call that creates a file, then text; (c) an `Agent` call whose sub-agent runs its
own tool call, and (d) auto-compaction. Claude Code assumes a 1,000,000-token context and
compacts when a response reports ~967K input tokens; here the proxy reports the true prompt
length, so the run pipes ~960 KB on stdin (one byte-level token per byte) and the first main
call really is that long. The trees must show a main root and a sub-agent root, a main_summary
leaf, the post-compaction branch, no branch from Claude Code's re-serialized tool inputs, and
exactly the ids the engine produced.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.trajectory import Node, NodeKind, TrajectoryTree
from tests.cli.conftest import CliRun, run_cli
from tests.support.proxy_stack import ProxyStack, scripted_ids

pytestmark = [pytest.mark.cli, pytest.mark.slow]

BASH = '{"name": "Bash", "arguments": {"description": "Create file", "command": "echo hi > hello.txt"}}'
LS = '{"name": "Bash", "arguments": {"description": "List files", "command": "ls"}}'
AGENT = json.dumps(
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


async def claude(
    claude_bin: Path, stack: ProxyStack, key: str, prompt: str, tmp: Path, stdin: bytes = b""
) -> CliRun:
    home = tmp / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": stack.base_url,
        "ANTHROPIC_API_KEY": key,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "IS_SANDBOX": "1",
    }
    argv = [str(claude_bin), "-p", prompt, "--output-format", "json", "--dangerously-skip-permissions"]
    run = await run_cli(argv, env, tmp / "work", stdin=stdin)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def outputs(tree: TrajectoryTree) -> list[Node]:
    """Output nodes in commit order."""
    return [n for n in tree.ordered_nodes() if n.kind is NodeKind.OUTPUT]


def assert_exact_ids(tree: TrajectoryTree, script: list[str]) -> None:
    recorded = outputs(tree)
    assert len(recorded) == len(script)
    for node, text in zip(recorded, script, strict=True):
        assert node.sampled is not None
        assert node.token_ids[node.sampled].tolist() == scripted_ids(text)
        assert len(node.logprobs) == node.num_sampled


async def test_a_text_answer(claude_bin: Path, stack: ProxyStack, tmp_path: Path) -> None:
    key = await stack.open("cc-text", profile="claude_code")
    script = ["Hello from the model.<|im_end|>"]
    await stack.script("cell-0", script)
    run = await claude(claude_bin, stack, key, "Say hello", tmp_path)
    assert json.loads(run.stdout)["result"] == "Hello from the model."
    tree = stack.tree("cc-text")
    assert [str(r.agent_kind) for r in tree.roots.values()] == ["main"]
    assert [str(leaf.leaf_class) for leaf in tree.leaves()] == ["main"]
    assert_exact_ids(tree, script)
    assert sorted((await stack.stored_tree("cc-text")).nodes) == sorted(tree.nodes)


async def test_a_bash_tool_call_creates_the_file(claude_bin: Path, stack: ProxyStack, tmp_path: Path) -> None:
    key = await stack.open("cc-bash", profile="claude_code")
    script = [
        f"I will create it.<tool_call>{BASH}</tool_call><|im_end|>",
        "Done: created hello.txt.<|im_end|>",
    ]
    await stack.script("cell-0", script)
    run = await claude(claude_bin, stack, key, "Create hello.txt containing hi", tmp_path)
    assert json.loads(run.stdout)["result"] == "Done: created hello.txt."
    assert (run.workdir / "hello.txt").read_text().strip() == "hi"
    tree = stack.tree("cc-bash")
    call, answer = outputs(tree)
    # Claude Code echoes the Bash input with its keys in schema order; the tree restored the
    # emitted payload, so the second call extended the first output instead of branching.
    assert call.tool_calls[0].raw is not None and call.tool_calls[0].raw.index(
        '"description"'
    ) < call.tool_calls[0].raw.index('"command"')
    assert call in answer.path() and len(call.child_nodes) == 1
    assert len(tree.leaves()) == 1 and tree.leaves()[0] is answer
    assert_exact_ids(tree, script)


async def test_a_sub_agent_and_auto_compaction(claude_bin: Path, stack: ProxyStack, tmp_path: Path) -> None:
    key = await stack.open("cc-agent", profile="claude_code")
    script = [
        f"Delegating.<tool_call>{AGENT}</tool_call><|im_end|>",  # main, ~1M-token prompt
        f"<tool_call>{LS}</tool_call><|im_end|>",  # sub-agent
        "The directory is empty.<|im_end|>",  # sub-agent
        "<analysis>a</analysis>\n<summary>Listed the files; next, write hello.txt.</summary><|im_end|>",  # compaction
        f"Now writing.<tool_call>{BASH}</tool_call><|im_end|>",  # main, after compaction
        "All done.<|im_end|>",  # main
    ]
    await stack.script("cell-0", script)
    notes = (
        "Background notes for the task. " * 31_000
    ).encode()  # ~960 KB: pushes the context past compaction
    run = await claude(
        claude_bin, stack, key, "Delegate listing the files, then create hello.txt", tmp_path, stdin=notes
    )
    assert json.loads(run.stdout)["result"] == "All done."
    assert (run.workdir / "hello.txt").read_text().strip() == "hi"
    assert (await stack.script_status("cell-0"))["queued"] == 0

    tree = stack.tree("cc-agent")
    main_root, sub_root = sorted(tree.roots.values(), key=lambda r: r.node_id)
    assert (str(main_root.agent_kind), str(sub_root.agent_kind)) == ("main", "sub")
    delegate, listing, listed, summary, writing, done = outputs(tree)
    assert [str(n.leaf_class) for n in (delegate, listing, listed, summary, writing, done)] == [
        "main", "sub_agent", "sub_agent", "main_summary", "main", "main",
    ]  # fmt: skip
    assert sum(n.num_tokens for n in delegate.path()) > 960_000  # what made Claude Code compact
    assert delegate.path()[0] is main_root and listing.path()[0] is sub_root
    # The sub-agent's second call extended its first output (its Bash echo was restored) ...
    assert listing in listed.path() and len(listing.child_nodes) == 1
    # ... the compaction request extended the main path that was compacted ...
    assert delegate in summary.path() and summary.is_leaf
    # ... and the continuation after it is a new branch under the same main root, which the
    # following call extends without a spurious branch.
    assert writing.path()[0] is main_root and delegate not in writing.path()
    assert writing in done.path() and len(writing.child_nodes) == 1
    assert sorted(str(leaf.leaf_class) for leaf in tree.leaves()) == ["main", "main_summary", "sub_agent"]
    assert_exact_ids(tree, script)
    closed = await stack.close("cc-agent")
    assert closed.num_calls == len(script) and closed.num_nodes == len(tree.nodes)
    stored = await stack.stored_tree("cc-agent")
    assert stored.closed and sorted(stored.nodes) == sorted(tree.nodes)
