"""The real Codex CLI (unmodified, offline) against the proxy with a scripted engine.

Codex calls `POST /v1/responses` with SSE, its tools at the top level and the system prompt as a
`developer` message, through a custom provider in `$CODEX_HOME/config.toml` (`wire_api =
"responses"`; `OPENAI_BASE_URL` is ignored). The scripted model makes one `exec_command` call that
creates a file, then answers; the file must exist, and the tree must hold one path with exactly
the ids the engine produced.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.trajectory import NodeKind
from tests.cli.conftest import run_cli
from tests.support.proxy_stack import ProxyStack, scripted_ids

pytestmark = [pytest.mark.cli, pytest.mark.slow]

EXEC = '{"name": "exec_command", "arguments": {"cmd": "echo hi > hello.txt"}}'


async def test_an_exec_command_call_creates_the_file(
    codex_bin: Path, stack: ProxyStack, tmp_path: Path
) -> None:
    key = await stack.open("codex-1", profile="codex")
    script = [f"<tool_call>{EXEC}</tool_call><|im_end|>", "Done: created hello.txt.<|im_end|>"]
    await stack.script("cell-0", script)
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "gyre-policy"\nmodel_provider = "gyre"\n\n[model_providers.gyre]\nname = "gyre"\n'
        f'base_url = "{stack.base_url}/v1"\nenv_key = "OPENAI_API_KEY"\nwire_api = "responses"\n'
    )
    env = {"CODEX_HOME": str(home), "HOME": str(tmp_path), "OPENAI_API_KEY": key}
    argv = [
        str(codex_bin),
        "exec",
        "--skip-git-repo-check",
        "-s",
        "danger-full-access",
        "--json",
        "Create hello.txt",
    ]
    run = await run_cli(argv, env, tmp_path / "work")
    assert run.returncode == 0, run.stderr[-3000:]
    assert (run.workdir / "hello.txt").read_text().strip() == "hi"
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    messages = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"]["type"] == "agent_message"
    ]
    assert messages == ["Done: created hello.txt."]
    assert not [e for e in events if e.get("type") in ("error", "turn.failed")]

    tree = stack.tree("codex-1")
    call, answer = [n for n in tree.ordered_nodes() if n.kind is NodeKind.OUTPUT]
    assert [str(r.agent_kind) for r in tree.roots.values()] == ["main"]
    assert call in answer.path() and tree.leaves() == [answer]  # the echoed call matched: one path
    for node, text in zip((call, answer), script, strict=True):
        assert node.sampled is not None and node.token_ids[node.sampled].tolist() == scripted_ids(text)
