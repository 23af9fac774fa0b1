"""Training runs on the real, pinned CLIs inside the task's own container: Claude Code and Codex launched
by the runner in containers of examples/tasks/fix-sum's image (built by the engine from its Dockerfile,
FROM the local Debian base, whose RUN step installs the checker the task's tests/test.sh runs), their
calls relayed out of the network-less container to the proxy and on to an engine serving a tiny Qwen3
from `gyre model init`, the reward from test.sh run in the same container after the harness, and one
elastic optimizer step on what they sent. The same workspaces scored by the evaluator's verifier under
the `process` launcher, on the host, where the image's RUN step never ran, earn 0 each, the fixed ones too
(tests/integration/test_container_runs.py shows it for whole runs under each launcher).

As in tests/e2e/test_real_harnesses.py, a tiny random model does not call tools, so the engine's output
source is `scored_script` with rules: each member either fixes sum.sh and runs the checker or only runs
the checker, so the members of a group earn different rewards; its tokens carry the served model's
log-probs. Claude Code is shrunk with its own flags (a one-line system prompt, the Bash tool only), Codex
with its own config override (`-c instructions=…`: a one-line system prompt in place of ~26 KB)."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.demo.config import demo_config
from app.demo.run import DemoRun
from gyre.model.files import check_model_dir
from gyre.model.init import init_model_dir
from gyre.paths import REPO_ROOT
from gyre.sandbox import SandboxLimits
from gyre.sandbox.launchers.base import LABEL_RUN
from gyre.tasks import TaskSet
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.evaluator.verifier import VerifierRunner
from tests.e2e.test_real_harnesses import CODEX_ARGS
from tests.support.audit import assert_audited
from tests.support.containers import containers_of, engine_client
from tests.support.sandboxes import launcher_for_test

pytestmark = [
    pytest.mark.slow,
    pytest.mark.cli,
    pytest.mark.timeout(600),
    pytest.mark.usefixtures("container_session"),
]

#: One group of two, trained by one step: the least the CPU engine has to serve (each CLI request is
#: several thousand tokens).
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
FIX_CMD = "sed -i 's/$1 - $2/$1 + $2/' sum.sh && check-sum sum.sh"
CHECK_CMD = "check-sum sum.sh"


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


CLAUDE_RULES: list[dict[str, Any]] = [
    {"when": "<tool_response>", "text": "Done."},
    {
        "when": "^",
        "choices": [
            _call("Bash", command=FIX_CMD, description="Fix add and check it"),
            _call("Bash", command=CHECK_CMD, description="Check add"),
        ],
    },
]
CLAUDE_ARGS = ["--system-prompt", "You are a coding agent. Work in the current directory.", "--tools", "Bash"]
CODEX_RULES: list[dict[str, Any]] = [
    {"when": "<tool_response>", "text": "Done."},
    {"when": "^", "choices": [_call("exec_command", cmd=FIX_CMD), _call("exec_command", cmd=CHECK_CMD)]},
]


def _run(
    tmp_path: Path, run_id: str, harness: dict[str, Any], rules: list[dict[str, Any]]
) -> tuple[Any, dict[str, Any]]:
    model_dir = init_model_dir(
        tmp_path / "qwen3-tiny", arch="qwen3", size="tiny", seed=0, max_position_embeddings=32768
    )
    # container names hold the run id and are the engine's, not this test's: another run of this test on
    # the same host (or a leftover of a killed one) must not take them
    run_id = f"{run_id}-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "rules.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in rules))
    shutil.copytree(REPO_ROOT / "examples" / "tasks" / "fix-sum", tmp_path / "tasks" / "fix-sum")
    box = {"isolation": "container", "kill_grace_s": 2.0}
    config = demo_config(
        None,
        {
            "run": {"id": run_id, "dir": str(tmp_path / "runs")},
            "model": {"path": str(model_dir)},
            "tasks": {"dirs": [str(tmp_path / "tasks")], "queries": []},
            "runner": {**harness, "sandbox": box},
            # score_line verifiers (none here) would run on the host: uids of their own.
            "evaluator": {"sandbox": {**box, "uid_base": 154000}},
            "cell_agent": {"engine": {"output_source": "scored_script", "script_file": str(script)}},
            "scheduler": SHAPE,
        },
    )
    summary = DemoRun(config, steps=1).execute()
    return config, summary


def _assert_trained_in_containers(config: Any, summary: dict[str, Any]) -> None:
    assert summary["steps"] == 1
    assert_audited(config.run.path, steps=1)
    assert summary["executions"]["trained"] >= 2
    events = [json.loads(line) for line in (config.run.path / "events.jsonl").read_text().splitlines()]
    done = [e["event"] for e in events if e["type"] == "gyre.v1.EvaluationDone"]
    valid = [d for d in done if d.get("status") == "EVALUATION_STATUS_VALID"]
    assert len(valid) >= 2, done
    # The rewards are test.sh's, run in a fresh container of the task's image (the harness never ran there)
    # with each preserved workspace copied in: 1 exactly where
    # the preserved workspace holds the fix (the rules pick fix-and-check or check-only per request at
    # random; on the host the fix would earn 0: no check-sum there).
    assert all("in a fresh container of the task's image" in d["detail"] for d in valid), valid
    for d in valid:
        fixed = "$1 + $2" in (Path(d["workspace"]["path"]) / "sum.sh").read_text()
        assert float(d.get("reward", 0.0)) == (1.0 if fixed else 0.0), d
    on_host = asyncio.run(_scored_on_the_host(config, valid))
    assert on_host == {d["execution"]["executionId"]: 0.0 for d in valid}, on_host
    step = next(e["event"] for e in events if e["type"] == "gyre.v1.StepCompleted")
    assert int(step.get("policyVersion", 0)) == 1 and int(step.get("numTargets", 0)) > 0
    published = config.run.path / "checkpoints" / "published" / "v00000001"
    weights = published if published.is_dir() else config.run.path / "checkpoints" / "step-00000001"
    assert check_model_dir(weights).policy_version == 1
    assert containers_of(engine_client(), **{LABEL_RUN: config.run.id}) == []


async def _scored_on_the_host(config: Any, done: list[dict[str, Any]]) -> dict[str, float]:
    """Each preserved workspace scored again by the evaluator's verifier with the `process` launcher."""
    verifier = VerifierRunner(
        registry=TaskSet.from_section(config.tasks).registry,
        launcher=launcher_for_test("process", 0, 1),
        work_root=config.run.path / "host-evaluations",
        limits=SandboxLimits(),
        max_attempts=1,
        backoff_s=0.0,
        kill_grace_s=1.0,
    )
    scores = {}
    for d in done:
        eid = d["execution"]["executionId"]
        term = ev.ExecutionTerminated(
            execution=cm.ExecutionRef(execution_id=eid),
            reason=cm.TERMINATION_REASON_COMPLETED,
            workspace=cm.WorkspaceRef(path=d["workspace"]["path"]),
            task_id="tasks/fix-sum",
        )
        evaluation = await verifier.evaluate(term)
        assert evaluation.status == "valid", evaluation
        scores[eid] = evaluation.reward
    return scores


@pytest.mark.usefixtures("claude_bin")
def test_claude_code_runs_in_the_tasks_container_and_is_trained_on(tmp_path: Path) -> None:
    engine_client()
    config, summary = _run(
        tmp_path, "e2ectrclaude", {"harness": "claude_code", "harness_args": CLAUDE_ARGS}, CLAUDE_RULES
    )
    _assert_trained_in_containers(config, summary)
    assert set(summary["admitted_trajectories_by_class"]) == {"main"}


@pytest.mark.usefixtures("codex_bin")
def test_codex_runs_in_the_tasks_container_and_is_trained_on(tmp_path: Path) -> None:
    engine_client()
    config, summary = _run(
        tmp_path, "e2ectrcodex", {"harness": "codex", "harness_args": CODEX_ARGS}, CODEX_RULES
    )
    _assert_trained_in_containers(config, summary)
    assert set(summary["admitted_trajectories_by_class"]) == {"main"}
