"""Training runs on the real, pinned CLIs: Claude Code and Codex launched by the runner in sandboxes on a
Harbor task, their calls through the proxy to an engine serving a tiny Qwen3 from `gyre model init`,
the reward from the task's `tests/test.sh`, and one optimizer step on what they sent.

A tiny random model does not call tools, so the engine's output source is `scored_script` with
*rules*: each turn is chosen from the conversation (a regex over the decoded prompt), and its tokens
carry the served model's log-probs. The rules play a short agent — list the files, delegate to a
sub-agent, read its report after a compaction, fix the bug (or, for some calls, only run the tests),
finish — so every tree holds a main root with the paths before and after the compaction, a
compaction summary leaf and a sub-agent root, and the members of a group can earn different rewards.

The Claude Code run follows the README's walkthrough with a real checkpoint's chat template: its model
directory carries the template Qwen3 checkpoints ship (tests/fixtures/templates/shipped_qwen3.json),
which is not append-only, and the settings are the defaults, so the proxy renders with the verified
qwen3 template in its place (`proxy.template: auto`) and the run's summary records that.

Claude Code is shrunk only with its own flags (`runner.harness_args`, `runner.harness_env`):
`--system-prompt` replaces its ~7 KB system prompt with one line and `--tools Bash,Agent` keeps two of
its twelve tools, so its first request is ~13 KB instead of ~50 KB (fidelity: the policy never sees
Claude Code's own instructions or the other tools' schemas). Auto-compaction normally fires near 1 M
tokens; `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE` lowers its threshold to ~6K tokens, which the task's long
instruction (project notes) crosses after the main agent's first turn while the sub-agent's shorter
prompts stay below it (fidelity: compaction after one turn, where a real run compacts after hours).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from app.demo.config import demo_config
from app.demo.run import DemoRun
from gyre.model.files import check_model_dir
from gyre.model.init import init_model_dir
from tests.support.audit import assert_audited

# A one-step training run of a real CLI takes ~3–4 min alone on two cores (the engine scores ~10K-token
# prompts and the core trains on them on CPU), close to the suite's 300 s default when CI is busy.
pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]

#: One group of two dispatched (φ = 0, μ = 1, B = 1), the least one step needs: with φ = 1, μ = 2 three
#: groups were dispatched, six CLIs shared the engines and the two cores, and the first group was ready
#: after ~4× the time two take alone.
SHAPE: dict[str, Any] = {
    "num_cells": 2,
    "group_size": 2,
    "batch_groups": 1,
    "phi": 0,
    "mu": 1,
    "rho_min": 0.5,
    "tau_s": 0.2,
    "cell_capacity": 4,
}
COMPACT_AT_TOKENS = 6200
"""Claude Code's auto-compaction threshold in this run: a share of its 980K-token effective window.
The main agent's second request is 7.4K tokens of the tiny tokenizer (2.9 chars/token on the notes),
above it; the sub-agent's (4.1K and 4.7K) stay below. Claude Code refuses to compact when its estimate
of the fixed prefix (reported input tokens − message characters / 4) exceeds the threshold: with 220
notes that was ~6K and a 6K threshold was refused ("fixed prefix ~X > threshold — compaction cannot
help"); half the notes take ~2.6K tokens off it and ~1K off its estimate. Every token here is scored by
the engine, trained on and replayed by the audit, so the notes are as short as the margins allow."""


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


FIX = _call(
    "Bash",
    command="sed -i 's/a - b/a + b/' calc.py && python3 -m unittest test_calc",
    description="Fix add and run the tests",
)
ONLY_TEST = _call("Bash", command="python3 -m unittest test_calc", description="Run the tests")
CLAUDE_RULES: list[dict[str, Any]] = [
    # Compaction request (Claude Code appends this to the last user message).
    {
        "when": "CRITICAL: Respond with TEXT ONLY",
        "text": "<analysis>The sub-agent read calc.py.</analysis>\n<summary>add in calc.py returns a - b; it must "
        "return a + b. Next: fix it and run the tests.</summary>",
    },
    # The sub-agent: read the file, then report.
    {
        "when": r"You are an agent for Claude Code[\s\S]*<tool_response>",
        "text": "calc.py: add returns a - b instead of a + b.",
    },
    {
        "when": "You are an agent for Claude Code",
        "text": _call("Bash", command="cat calc.py", description="Read calc.py"),
    },
    # The main agent after compaction (the kept round holds the Agent call and its report): fix (or only
    # test), then, once the tests ran, finish.
    {"when": r"This session is being continued[\s\S]*Ran \d+ test", "text": "Done."},
    {"when": "This session is being continued", "choices": [FIX, ONLY_TEST]},
    # The main agent after the sub-agent's report without a compaction: stop (the test then fails on the
    # missing summary).
    {"when": "add returns a - b instead", "text": "Stopping."},
    # The main agent's second turn: delegate. Compaction is asked before the third: Claude Code summarizes
    # the rounds before the newest one, so the main agent needs two rounds (a first request over the
    # threshold is not compacted: nothing to summarize yet).
    {
        "when": "<tool_response>",
        "text": _call(
            "Agent",
            description="Find the bug",
            prompt="Read calc.py and report why add is wrong.",
            subagent_type="general-purpose",
            run_in_background=False,
        ),
    },
    # The main agent's first turn: look around.
    {"when": "^", "text": _call("Bash", command="ls", description="List the files")},
]
CLAUDE_ARGS = [
    "--system-prompt",
    "You are a coding agent. Work in the current directory.",
    "--tools",
    "Bash,Agent",
]
NOTES = "".join(
    f"- Note {i}: calc.py is imported by the reporting job; keep the signature of add(a, b) unchanged.\n"
    for i in range(110)
)


def _task_set(tmp_path: Path, notes: str) -> Path:
    """examples/tasks/fix-add with `notes` appended to its instruction (a Harbor task set of one)."""
    root = tmp_path / "tasks"
    shutil.copytree(REPO / "examples" / "tasks" / "fix-add", root / "fix-add")
    if notes:
        instruction = root / "fix-add" / "instruction.md"
        instruction.write_text(instruction.read_text() + "\nProject notes:\n" + notes)
    return root


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


SHIPPED_QWEN3 = REPO / "tests" / "fixtures" / "templates" / "shipped_qwen3.json"


def _run(
    tmp_path: Path,
    run_id: str,
    harness: dict[str, Any],
    rules: list[dict[str, Any]],
    notes: str = "",
    chat_template: str | None = None,
) -> tuple[Any, dict[str, Any]]:
    model_dir = init_model_dir(
        tmp_path / "qwen3-tiny", arch="qwen3", size="tiny", seed=0, max_position_embeddings=32768
    )
    if chat_template is not None:  # the model directory ships this template instead of Gyre's
        (model_dir / "chat_template.jinja").write_text(chat_template)
    script = tmp_path / "rules.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in rules))
    config = demo_config(
        None,
        {
            "run": {"id": run_id, "dir": str(tmp_path / "runs")},
            "model": {"path": str(model_dir)},
            "tasks": {"dirs": [str(_task_set(tmp_path, notes))], "queries": []},
            # Sandbox uids of their own: a runner kills every process of its uids, and this machine may be
            # running other stacks.
            "runner": {**harness, "sandbox": {"uid_base": 150000}},
            "evaluator": {"sandbox": {"uid_base": 151000}},
            "cell_agent": {"engine": {"output_source": "scored_script", "script_file": str(script)}},
            "scheduler": SHAPE,
        },
    )
    summary = DemoRun(config, steps=1).execute()
    return config, summary


def _assert_trained_one_step(config: Any, summary: dict[str, Any], events: list[dict[str, Any]]) -> None:
    assert summary["steps"] == 1
    assert_audited(config.run.path, steps=1)
    ex = summary["executions"]
    assert ex["trained"] >= 2
    # The reward is the task's verifier: test.sh wrote reward.txt in each preserved workspace's log dir.
    done = [e["event"] for e in events if e["type"] == "gyre.v1.EvaluationDone"]
    assert done and all(d.get("status") == "EVALUATION_STATUS_VALID" for d in done), done
    assert {float(d.get("reward", 0.0)) for d in done} <= {0.0, 1.0}
    step = next(e["event"] for e in events if e["type"] == "gyre.v1.StepCompleted")
    assert int(step.get("policyVersion", 0)) == 1 and int(step.get("numTargets", 0)) > 0
    # The step's weights as an HF directory: its publication when the run published it before stopping,
    # else the trainer checkpoint the core writes when it stops (the same files plus the optimizer).
    published = config.run.path / "checkpoints" / "published" / "v00000001"
    weights = published if published.is_dir() else config.run.path / "checkpoints" / "step-00000001"
    assert check_model_dir(weights).policy_version == 1


@pytest.mark.usefixtures("claude_bin")
def test_claude_code_executions_are_trained_on(tmp_path: Path) -> None:
    config, summary = _run(
        tmp_path,
        "e2eclaude",
        {
            "harness": "claude_code",
            "harness_args": CLAUDE_ARGS,
            "harness_env": {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": f"{100 * COMPACT_AT_TOKENS / 980_000:.3f}"},
        },
        CLAUDE_RULES,
        notes=NOTES,  # what pushes the main agent's second request over the compaction threshold
        chat_template=json.loads(SHIPPED_QWEN3.read_text())["chat_template"],
    )
    events = _events(config.run.path)
    _assert_trained_one_step(config, summary, events)
    # Default settings, the shipped Qwen3 template: the verified qwen3 template rendered in its place.
    template = summary["chat_template"]
    assert template["source"] == "registry" and template["family"] == "qwen3", template
    assert template["replaced"] != template["name"] and template["replaced_breaks"]
    # Every trained execution's tree (`gyre trace replay RUN_DIR --execution ID` shows one): two main
    # leaves (the path up to the compaction, and the continued session after it), the compaction
    # summary leaf and the sub-agent's root; admission took all of them.
    by_class = summary["admitted_trajectories_by_class"]
    ex = summary["executions"]
    members = ex["trained"]
    assert by_class == {"main": 2 * members, "main_summary": members, "sub_agent": members}, by_class
    assert members >= 1
    assert summary["recorded_calls"] >= 6 * members
    # One history mismatch per compaction, no more: the continued session repeats the newest round (the
    # Agent call) after the summary, under the main root but on another path, so that assistant turn is
    # rendered anew (context there, never a target). Executions cancelled before compacting have none.
    mismatches = round(summary["history_mismatch_rate"] * summary["recorded_calls"])
    assert members <= mismatches <= ex["dispatched"], (mismatches, ex)


CODEX_ARGS = ["-c", 'instructions="You are a coding agent. Work in the current directory."']
"""Codex's own config override: one line in place of its ~26 KB base instructions (its first request
is 2.1K tokens of the tiny tokenizer instead of 9.8K; fidelity as for Claude Code's `--system-prompt`)."""
CODEX_FIX = _call("exec_command", cmd="sed -i 's/a - b/a + b/' calc.py && python3 -m unittest test_calc")
CODEX_ONLY_TEST = _call("exec_command", cmd="python3 -m unittest test_calc")
CODEX_RULES: list[dict[str, Any]] = [
    {"when": "<tool_response>", "text": "Done."},
    {"when": "^", "choices": [CODEX_FIX, CODEX_ONLY_TEST]},
]


@pytest.mark.usefixtures("codex_bin")
def test_codex_executions_are_trained_on(tmp_path: Path) -> None:
    config, summary = _run(
        tmp_path, "e2ecodex", {"harness": "codex", "harness_args": CODEX_ARGS}, CODEX_RULES
    )
    events = _events(config.run.path)
    _assert_trained_one_step(config, summary, events)
    by_class = summary["admitted_trajectories_by_class"]
    assert set(by_class) == {"main"} and by_class["main"] >= 2, by_class
    assert summary["recorded_calls"] >= 2 * by_class["main"] and summary["history_mismatch_rate"] == 0.0
