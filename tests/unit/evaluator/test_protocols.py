"""Verifier protocols on real sandboxes: a Harbor task's tests/test.sh scored on a preserved workspace,
with Harbor's absolute paths bind-mounted (`isolated`, root) or rewritten (`process`); a verifier
that writes no reward is pending, retried, then excluded, never a zero."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from gyre.sandbox import SandboxLimits
from gyre.sandbox.workspace import create_workspace
from gyre.tasks import TaskRegistry
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.evaluator.protocols import PROTOCOLS, resolve_env
from services.evaluator.verifier import VerifierRunner
from tests.support.sandboxes import launcher_for_test

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "tasks" / "fix-add"
SUPPORTED = ["process", "isolated"] if os.geteuid() == 0 else ["process"]
UID_BASE = 170000


def test_every_verifier_protocol_of_the_task_model_is_registered() -> None:
    from typing import get_args

    from gyre.tasks.task import VerifierProtocol

    assert set(PROTOCOLS) == set(get_args(VerifierProtocol))


def harbor_set(tmp_path: Path, test_sh: str | None = None, verifier_timeout_s: float = 20.0) -> TaskRegistry:
    root = tmp_path / "set"
    shutil.copytree(EXAMPLE, root / "fix-add")
    toml = root / "fix-add" / "task.toml"
    toml.write_text(
        toml.read_text()
        .replace("timeout_sec = 60.0", f"timeout_sec = {verifier_timeout_s}")
        .replace("timeout_sec = 300.0", "timeout_sec = 5.0")
    )
    if test_sh is not None:
        (root / "fix-add" / "tests" / "test.sh").write_text(test_sh)
    return TaskRegistry([root])


async def evaluate(
    tmp_path: Path,
    launcher: str,
    registry: TaskRegistry,
    fix: bool,
    max_attempts: int = 3,
    budget_s: float = 60.0,
) -> tuple[str, float, int, str]:
    task = registry.get("set/fix-add")
    workspace = create_workspace(task, tmp_path / "workspaces" / "e1")
    if fix:
        calc = workspace / "calc.py"
        calc.write_text(calc.read_text().replace("return a - b", "return a + b"))
    runner = VerifierRunner(
        registry=registry,
        launcher=launcher_for_test(launcher, UID_BASE, 2),
        work_root=tmp_path / "evaluations",
        limits=SandboxLimits(cpu_s=60, memory_mb=None),
        max_attempts=max_attempts,
        backoff_s=0.1,
        kill_grace_s=1.0,
    )
    term = ev.ExecutionTerminated(
        execution=cm.ExecutionRef(execution_id="e1"),
        reason=cm.TERMINATION_REASON_COMPLETED,
        task_id=task.task_id,
        workspace=cm.WorkspaceRef(path=str(workspace)),
        budget_deadline_ms=int((time.time() + budget_s) * 1000),
    )
    e = await runner.evaluate(term)
    return e.status, e.reward, e.attempts, e.detail


@pytest.mark.parametrize("launcher", SUPPORTED)
async def test_harbor_reward_comes_from_test_sh(launcher: str, tmp_path: Path) -> None:
    registry = harbor_set(tmp_path)
    assert await evaluate(tmp_path / "fixed", launcher, registry, fix=True) == (
        "valid",
        1.0,
        1,
        "reward.txt: 1",
    )
    assert await evaluate(tmp_path / "bug", launcher, registry, fix=False) == (
        "valid",
        0.0,
        1,
        "reward.txt: 0",
    )


@pytest.mark.parametrize("launcher", SUPPORTED)
async def test_harbor_paths_are_mounted_as_root_and_rewritten_otherwise(
    launcher: str, tmp_path: Path
) -> None:
    script = (
        '#!/bin/bash\necho "$PWD|$(cat /tests/marker)|$GREETING" > /logs/verifier/where.txt\n'
        "ls /logs/agent > /logs/verifier/agent.txt\necho 0.5 > /logs/verifier/reward.txt\n"
    )
    registry = harbor_set(tmp_path, script)
    (tmp_path / "set" / "fix-add" / "tests" / "marker").write_text("from /tests")
    toml = tmp_path / "set" / "fix-add" / "task.toml"
    toml.write_text(
        toml.read_text().replace(
            "[verifier]\n", '[verifier]\nenv = { GREETING = "${GYRE_TEST_GREETING:-hi} /app" }\n'
        )
    )
    status, reward, _, _ = await evaluate(tmp_path, launcher, registry, fix=False)
    assert (status, reward) == ("valid", 0.5)
    (attempt,) = (tmp_path / "evaluations" / "e1").iterdir()
    cwd, marker, greeting = (attempt / "logs" / "verifier" / "where.txt").read_text().strip().split("|")
    copy = str(attempt / "workspace")
    if launcher == "isolated":
        assert (cwd, marker, greeting) == ("/app", "from /tests", "hi /app")
    else:  # every text file of tests/ is rewritten, data included: the cost of having no mount namespace
        assert (cwd, marker, greeting) == (copy, f"from {attempt / 'tests'}", f"hi {copy}")
    assert not Path("/app").exists() and not Path("/tests").exists()  # nothing was created on the host


@pytest.mark.parametrize("launcher", SUPPORTED)
async def test_a_verifier_that_writes_no_reward_is_pending_then_excluded(
    launcher: str, tmp_path: Path
) -> None:
    registry = harbor_set(tmp_path, "#!/bin/bash\necho 'ran the tests, forgot the reward'\nexit 0\n")
    status, reward, attempts, detail = await evaluate(tmp_path, launcher, registry, fix=True, max_attempts=3)
    assert (status, reward, attempts) == ("excluded", 0.0, 3)
    assert "no valid score within the budget" in detail
    assert (
        "the verifier wrote no reward (neither /logs/verifier/reward.txt nor reward.json); test.sh exit 0"
        in detail
    )


async def test_bad_reward_files_are_failed_attempts_not_zeros(tmp_path: Path) -> None:
    cases = {
        "echo 1.5 > /logs/verifier/reward.txt": "reward.txt holds 1.5: Gyre rewards are numbers in [0, 1]",
        ": > /logs/verifier/reward.txt": "reward.txt is empty",
        "echo pass > /logs/verifier/reward.txt": "reward.txt is not a number: 'pass'",
        "ln -s /etc/shadow /logs/verifier/reward.txt": "reward.txt is unreadable",
        """echo '{"a": 1, "b": 0}' > /logs/verifier/reward.json""": "reward.json has no `reward` among ['a', 'b']",
        "echo 0.25 > /logs/verifier/reward.txt; exit 1": None,
        """echo '{"reward": 0.75, "n": 3}' > /logs/verifier/reward.json""": None,
    }
    for i, (line, why) in enumerate(cases.items()):
        registry = harbor_set(tmp_path / str(i), f"#!/bin/bash\n{line}\n")
        status, reward, attempts, detail = await evaluate(
            tmp_path / str(i), SUPPORTED[-1], registry, fix=False, max_attempts=1
        )
        if why is None:
            assert status == "valid", detail
        else:
            assert (status, attempts) == ("excluded", 1) and why in detail, (line, detail)
        if "exit 1" in line:
            assert (reward, detail) == (0.25, "reward.txt: 0.25 (test.sh exit 1)")
        if "0.75" in line:
            assert reward == 0.75


def test_verifier_env_templates() -> None:
    assert resolve_env({"A": "${X}-${Y:-dflt}", "B": "plain"}, {"X": "x"}) == {"A": "x-dflt", "B": "plain"}
    with pytest.raises(ValueError, match=r"verifier env A: \$\{MISSING\} is not set"):
        resolve_env({"A": "${MISSING}"}, {})
