"""Verifier protocols: how one attempt is laid out for its sandbox and how its result is read.

    protocol = PROTOCOLS[task.verifier.protocol]
    plan = protocol.plan(task, attempt_root, workspace_copy, preserved_workspace, bind=launcher.mounts_paths)
    ... run plan.argv in plan.cwd with plan.env, plan.binds ...
    attempt = protocol.result(attempt_root, outcome, stdout)

- `score_line`: the task's argv in the workspace copy; exit 0 and a last stdout line `{"score": x}`.
- `harbor`: `bash /tests/test.sh` from the working directory, with a fresh copy of the task's
  `tests/` at /tests, an empty /logs/verifier and the execution's agent logs at /logs/agent (bind
  mounts, or rewritten paths: gyre/sandbox/task_paths.py); the reward from /logs/verifier
  (services/evaluator/rewards.py), whatever test.sh's exit status, as Harbor reads it.

Adding one: subclass `VerifierProtocol`, set `name`, implement `plan` and `result`, add it to
`PROTOCOLS` and to `gyre.tasks.task.VerifierProtocol`; tests/unit/evaluator/test_protocols.py runs
every entry.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from gyre.paths import REPO_ROOT
from gyre.sandbox import SandboxOutcome
from gyre.sandbox.host import BASE_PATH
from gyre.sandbox.task_paths import agent_logs_of, verifier_view
from gyre.tasks import Task
from gyre.tasks.dockerfile import DEFAULT_WORKDIR
from services.evaluator.rewards import parse_score, read_reward

_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True, slots=True)
class Attempt:
    score: float | None
    detail: str


@dataclass(frozen=True, slots=True)
class AttemptPlan:
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    writable: tuple[Path, ...]
    reveal: tuple[Path, ...] = ()
    binds: tuple[tuple[Path, str], ...] = field(default_factory=tuple)


def resolve_env(env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`${NAME}` / `${NAME:-default}` in the values taken from `environ` (the evaluator's); a name that
    is unset without a default is a `ValueError` naming it."""
    source = os.environ if environ is None else environ

    def one(key: str, value: str) -> str:
        def sub(m: re.Match[str]) -> str:
            if m.group(1) in source:
                return source[m.group(1)]
            if m.group(2) is not None:
                return m.group(2)
            raise ValueError(
                f"verifier env {key}: ${{{m.group(1)}}} is not set in the evaluator's environment"
            )

        return _TEMPLATE.sub(sub, value)

    return {k: one(k, v) for k, v in env.items()}


class VerifierProtocol(ABC):
    name: ClassVar[str]

    @abstractmethod
    def plan(self, task: Task, root: Path, copy: Path, workspace: Path, bind: bool) -> AttemptPlan:
        """Lay out attempt `root` (the workspace copy is at `copy`); `bind` = the launcher mounts paths."""

    @abstractmethod
    def result(self, root: Path, outcome: SandboxOutcome, stdout: str) -> Attempt:
        """The attempt's score, or None with why not (a failed attempt: pending)."""


class ScoreLineProtocol(VerifierProtocol):
    name = "score_line"

    def plan(self, task: Task, root: Path, copy: Path, workspace: Path, bind: bool) -> AttemptPlan:
        env = {
            "PATH": BASE_PATH,
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONDONTWRITEBYTECODE": "1",
            **resolve_env(task.verifier.env),
        }
        return AttemptPlan(
            task.verifier_argv(sys.executable),
            copy,
            env,
            (copy,),
            reveal=tuple(p for p in (REPO_ROOT, task.task_dir) if p is not None),
        )

    def result(self, root: Path, outcome: SandboxOutcome, stdout: str) -> Attempt:
        if outcome.exit_code != 0:
            return Attempt(None, f"verifier failed ({outcome.describe()})")
        return Attempt(*parse_score(stdout))


class HarborProtocol(VerifierProtocol):
    name = "harbor"

    def plan(self, task: Task, root: Path, copy: Path, workspace: Path, bind: bool) -> AttemptPlan:
        assert task.verifier.tests_dir is not None, "a Harbor verifier has a tests/ directory"
        view = verifier_view(task, root, copy, bind)
        tests, logs = root / "tests", root / "logs"
        shutil.copytree(task.verifier.tests_dir, tests, symlinks=True)
        (logs / "verifier").mkdir(parents=True)
        agent_logs = agent_logs_of(workspace)
        if agent_logs.is_dir():
            shutil.copytree(agent_logs, logs / "agent", symlinks=True)
        else:
            (logs / "agent").mkdir()
        view.rewrite_tree(tests)
        env = {k: view.rewrite(v) for k, v in resolve_env(task.verifier.env).items()}
        return AttemptPlan(
            argv=[view.rewrite(a) for a in task.verifier.argv],
            cwd=view.cwd(task.environment.workdir or DEFAULT_WORKDIR),
            env={"PATH": BASE_PATH, "LANG": "C.UTF-8", **env},
            writable=(copy, tests, logs),
            binds=view.binds(),
        )

    def result(self, root: Path, outcome: SandboxOutcome, stdout: str) -> Attempt:
        reward, detail = read_reward(root / "logs" / "verifier")
        shutil.rmtree(root / "tests", ignore_errors=True)
        if reward is None:
            return Attempt(None, f"{detail}; test.sh {outcome.describe()}")
        return Attempt(
            reward, detail if outcome.exit_code == 0 else f"{detail} (test.sh {outcome.describe()})"
        )


PROTOCOLS: dict[str, VerifierProtocol] = {p.name: p for p in (ScoreLineProtocol(), HarborProtocol())}
