"""Harness commands: how the runner turns (task, proxy credentials) into argv + environment.

    harness = make_harness(section)          # from RunnerSection.harness
    argv = harness.command(launch)           # argv + runner.harness_args
    env = harness.environment(launch)        # runner.harness_env + the harness's own; nothing else reaches the sandbox

- `demo`: `python -m harness --task ID --prompt TEXT` (this repository's agent loop; the id labels its report).
- `claude_code`: `claude -p TEXT --output-format json --dangerously-skip-permissions`, offline
  (telemetry, error reporting, auto-update and non-essential traffic off; `IS_SANDBOX=1`, which
  Claude Code needs to skip permissions as root).
- `codex`: `codex exec … --json TEXT` with a `CODEX_HOME/config.toml` that points its
  `responses` provider at the proxy (`OPENAI_BASE_URL` is ignored by Codex).
- `command`: any argv with `{prompt}`, `{task_id}`, `{execution_id}`, `{python}` expanded (a
  deterministic stand-in agent in tests, a custom harness elsewhere).

`runner.harness_args` and `runner.harness_env` are the user's knobs on the unmodified CLI (its own
flags and environment variables, e.g. Claude Code's `--system-prompt`, `--tools` and
`CLAUDE_AUTOCOMPACT_PCT_OVERRIDE`); the variables that route the harness to the proxy are the runner's
and cannot be overridden (`HARNESS_ROUTING_ENV`).

A harness that is `python -m MODULE` names it in `fork_module` (with `fork_paths`, its PYTHONPATH): the
runner then forks its executions from a fork server that imported MODULE once (runner.fork_server).

Adding one: subclass `HarnessCommand`, set `name`, implement `argv` (and `env`/`prepare` when
needed), add it to `HARNESSES` and to `RunnerSection.harness`; the contract test in
tests/unit/runner/test_harnesses.py checks every entry.
"""

from __future__ import annotations

import os
import shutil
import sys
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from gyre.config.runner import HARNESS_ROUTING_ENV, RunnerSection
from gyre.paths import REPO_ROOT
from gyre.sandbox import SandboxLimits
from gyre.sandbox.host import BASE_PATH
from gyre.tasks import Task


@dataclass(frozen=True, slots=True)
class Launch:
    """What a harness command is built from."""

    task: Task
    prompt: str
    """The task's prompt as the harness gets it (its environment paths rewritten where they cannot be mounted)."""
    execution_id: str
    base_url: str
    """The proxy as the harness reaches it (inside the sandbox)."""
    api_key: str
    home: Path


class HarnessCommand(ABC):
    name: ClassVar[str]
    fork_module: ClassVar[str | None] = None
    """The module of a `python -m MODULE` harness a fork server may preload (None: always a new process)."""
    fork_paths: ClassVar[tuple[str, ...]] = ()
    """The PYTHONPATH entries the harness gets (the fork server puts them first on its sys.path)."""

    def __init__(self, extra_args: list[str] | None = None, extra_env: dict[str, str] | None = None) -> None:
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(extra_env or {})
        routed = sorted(HARNESS_ROUTING_ENV & set(self.extra_env))
        if routed:
            raise ValueError(
                f"runner.harness_env cannot set {', '.join(routed)}: the runner routes the harness"
            )

    @abstractmethod
    def argv(self, launch: Launch) -> list[str]:
        """The command line (extra args appended by the caller through `command`)."""

    def env(self, launch: Launch) -> dict[str, str]:
        """Environment of the harness: nothing else from the runner's environment is passed."""
        return {
            "PATH": BASE_PATH,
            "LANG": "C.UTF-8",
            "ANTHROPIC_BASE_URL": launch.base_url,
            "ANTHROPIC_API_KEY": launch.api_key,
        }

    def home_files(self, launch: Launch) -> dict[str, str]:
        """Files (relative to HOME) the harness needs before it starts."""
        return {}

    def limits(self, limits: SandboxLimits) -> SandboxLimits:
        """Adjust the sandbox limits for this harness."""
        return limits

    def reveal(self) -> tuple[Path, ...]:
        """Paths the harness needs besides its workspace and the Python installation."""
        return (REPO_ROOT,)

    def command(self, launch: Launch) -> list[str]:
        return [*self.argv(launch), *self.extra_args]

    def environment(self, launch: Launch) -> dict[str, str]:
        """What the sandbox gets: `runner.harness_env` under the harness's own variables."""
        return {**self.extra_env, **self.env(launch)}


class DemoHarness(HarnessCommand):
    name = "demo"
    fork_module = "harness"
    fork_paths = (str(REPO_ROOT),)

    def argv(self, launch: Launch) -> list[str]:
        task = launch.task
        tools = ["--tools", ",".join(task.tools)] if task.tools else []
        # A seed per execution: tool-latency sleeps and retry jitter differ between the members of a group.
        seed = str(zlib.crc32(launch.execution_id.encode()))
        return [
            sys.executable,
            "-m",
            "harness",
            "--task",
            task.task_id,
            "--prompt",
            launch.prompt,
            *tools,
            "--seed",
            seed,
        ]

    def env(self, launch: Launch) -> dict[str, str]:
        return {
            **super().env(launch),
            "PYTHONPATH": os.pathsep.join(self.fork_paths),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }


def _node_binary(name: str) -> str:
    local = REPO_ROOT / "node_modules" / ".bin" / name
    return str(local) if local.exists() else (shutil.which(name) or name)


class ClaudeCodeHarness(HarnessCommand):
    name = "claude_code"

    def argv(self, launch: Launch) -> list[str]:
        return [
            _node_binary("claude"),
            "-p",
            launch.prompt,
            "--output-format",
            "json",
            "--dangerously-skip-permissions",
        ]

    def env(self, launch: Launch) -> dict[str, str]:
        return {
            **super().env(launch),
            "PATH": f"{REPO_ROOT / 'node_modules' / '.bin'}:{BASE_PATH}",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "IS_SANDBOX": "1",
        }

    def limits(self, limits: SandboxLimits) -> SandboxLimits:
        return replace(limits, memory_mb=None)  # JS runtimes reserve far more address space than they use


class CodexHarness(HarnessCommand):
    name = "codex"

    def argv(self, launch: Launch) -> list[str]:
        return [
            _node_binary("codex"),
            "exec",
            "--skip-git-repo-check",
            "-s",
            "danger-full-access",
            "--json",
            launch.prompt,
        ]

    def env(self, launch: Launch) -> dict[str, str]:
        return {
            "PATH": f"{REPO_ROOT / 'node_modules' / '.bin'}:{BASE_PATH}",
            "LANG": "C.UTF-8",
            "OPENAI_API_KEY": launch.api_key,
            "CODEX_HOME": str(launch.home / ".codex"),
        }

    def home_files(self, launch: Launch) -> dict[str, str]:
        return {
            ".codex/config.toml": 'model_provider = "gyre"\n\n[model_providers.gyre]\nname = "gyre"\n'
            f'base_url = "{launch.base_url.rstrip("/")}/v1"\nenv_key = "OPENAI_API_KEY"\nwire_api = "responses"\n'
        }

    def limits(self, limits: SandboxLimits) -> SandboxLimits:
        return replace(limits, memory_mb=None)


class CommandHarness(HarnessCommand):
    name = "command"

    def __init__(
        self,
        template: list[str],
        extra_args: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(extra_args, extra_env)
        if not template:
            raise ValueError("the command harness needs a non-empty argv template")
        self.template = list(template)

    def argv(self, launch: Launch) -> list[str]:
        values = {
            "{prompt}": launch.prompt,
            "{task_id}": launch.task.task_id,
            "{execution_id}": launch.execution_id,
            "{python}": sys.executable,
        }
        out = []
        for arg in self.template:
            for key, value in values.items():
                arg = arg.replace(key, value)
            out.append(arg)
        return out


HARNESSES: dict[str, type[HarnessCommand]] = {
    DemoHarness.name: DemoHarness,
    ClaudeCodeHarness.name: ClaudeCodeHarness,
    CodexHarness.name: CodexHarness,
    CommandHarness.name: CommandHarness,
}


def make_harness(section: RunnerSection) -> HarnessCommand:
    if section.harness == CommandHarness.name:
        return CommandHarness(section.command, section.harness_args, section.harness_env)
    return HARNESSES[section.harness](section.harness_args, section.harness_env)
