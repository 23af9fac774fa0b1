"""The demo harness against a scripted Anthropic endpoint: one execution that retries a failed
call, delegates to a sub-agent and compacts its context; asserts on the requests it sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import prompts
from tests.support.scripted_anthropic import Fail, ScriptedAnthropic, text, tool_use

TASK = "Write 1 to a.txt and have a sub-agent write 2 to b.txt."


def run_harness(base_url: str, workspace: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "exec-key",
    }
    cmd = [
        sys.executable,
        "-m",
        "harness",
        "--prompt",
        TASK,
        "--workspace",
        str(workspace),
        "--backoff-s",
        "0.01",
    ]
    return subprocess.run([*cmd, *extra], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("stream", [True, False])
def test_one_execution_retries_delegates_and_compacts(tmp_path: Path, stream: bool) -> None:
    script = [
        Fail(529, "overloaded"),
        tool_use("write_file", {"path": "a.txt", "content": "1"}),
        tool_use("delegate", {"task": "Write 2 to b.txt."}),
        tool_use("write_file", {"path": "b.txt", "content": "2"}),
        text("b.txt holds 2."),
        tool_use("read_file", {"path": "a.txt"}, input_tokens=50_000),
        text("a.txt and b.txt are written."),
        text("Done."),
    ]
    with ScriptedAnthropic(script) as api:
        done = run_harness(api.base_url, tmp_path, *([] if stream else ["--no-stream"]))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["retries"], report["summaries"], report["sub_agents"], report["compactions"]) == (
        1,
        1,
        1,
        1,
    )
    assert (tmp_path / "a.txt").read_text() == "1" and (tmp_path / "b.txt").read_text() == "2"

    reqs = api.requests
    assert len(reqs) == len(script)
    assert all(r.api_key == "exec-key" and r.path.startswith("/v1/messages") for r in reqs)
    assert all(bool(r.body.get("stream")) is stream for r in reqs)

    # Retry: the failed request is sent again unchanged.
    assert isinstance(reqs[0].step, Fail) and reqs[0].body == reqs[1].body

    # Sub-agent: own system prompt, own context starting from the delegated task, no delegate tool.
    sub = [r for r in reqs if r.headers.get("x-gyre-agent") == "sub"]
    assert [reqs.index(r) for r in sub] == [3, 4]
    for r in sub:
        assert r.system == prompts.SUB_SYSTEM and r.first_user_text() == "Write 2 to b.txt."
        assert "delegate" not in [t["name"] for t in r.body["tools"]]
    main = [r for r in reqs if "x-gyre-agent" not in r.headers]
    assert all(r.system == prompts.MAIN_SYSTEM for r in main)
    delegate_result = reqs[5].body["messages"][-1]["content"][0]
    assert delegate_result["type"] == "tool_result" and delegate_result["content"] == "b.txt holds 2."

    # Compaction: a summary request over the whole main history, then a fresh history from the summary.
    summary = [r for r in reqs if r.headers.get("x-gyre-request") == "summary"]
    assert summary == [reqs[6]]
    history = summary[0].body["messages"]
    assert history[:-1] == reqs[5].body["messages"] + [history[-2]]
    assert history[-1]["content"][-1] == {"type": "text", "text": prompts.SUMMARY_INSTRUCTION}
    assert history[-1]["content"][0]["type"] == "tool_result"
    resumed = reqs[7].body["messages"]
    assert resumed == [
        {"role": "user", "content": prompts.resumed_prompt(TASK, "a.txt and b.txt are written.")}
    ]
    assert "x-gyre-request" not in reqs[7].headers


def test_a_call_that_keeps_failing_ends_the_harness_with_status_3(tmp_path: Path) -> None:
    with ScriptedAnthropic([Fail(500)] * 3) as api:
        done = run_harness(api.base_url, tmp_path, "--retries", "2")
    assert done.returncode == 3
    assert len(api.requests) == 3
    assert "failed after 3 attempt(s)" in done.stderr


def test_a_client_error_is_not_retried(tmp_path: Path) -> None:
    with ScriptedAnthropic([Fail(400, "bad request"), text("never sent")]) as api:
        done = run_harness(api.base_url, tmp_path)
    assert done.returncode == 3 and len(api.requests) == 1
