"""Harness commands: how the runner turns (task, proxy credentials) into argv + environment.

    check_harness(section)                   # ConfigError unless RunnerSection.harness is in HARNESSES
    harness = make_harness(section)
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

In a container (the `container` launcher) a harness runs the same way from what it mounts read-only
(`tools()`: Claude Code's and Codex's native binaries, the demo harness's packages) under /.gyre/tools,
with the image's PATH; `Launch.inside` says which.

`runner.harness_args` and `runner.harness_env` are the user's knobs on the unmodified CLI (its own
flags and environment variables, e.g. Claude Code's `--system-prompt`, `--tools` and
`CLAUDE_AUTOCOMPACT_PCT_OVERRIDE`); the variables that route the harness to the proxy are the runner's
and cannot be overridden (`HARNESS_ROUTING_ENV`).

A harness that is `python -m MODULE` names it in `fork_module` (with `fork_paths`, its PYTHONPATH): the
runner then forks its executions from a fork server that imported MODULE once (runner.fork_server).

Adding one: subclass `HarnessCommand`, set `name`, implement `argv` (and `env`/`prepare` when
needed) and add it to `HARNESSES`, the one list of harnesses: `runner.harness` names an entry, checked by
`check_harness` at `gyre up` and at the runner's start; the contract test in
tests/unit/runner/test_harnesses.py checks every entry.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from gyre import tls
from gyre.config.runner import HARNESS_ROUTING_ENV, RunnerSection
from gyre.errors import ConfigError
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
    inside: bool = False
    """The harness runs in a container: its binaries are the read-only mounts of `tools()`, under
    `TOOLS_INSIDE`, and `path` is the image's PATH."""
    path: str = BASE_PATH
    """The PATH the harness starts from (the harness puts its own bin directories in front)."""


TOOLS_INSIDE = "/.gyre/tools"
"""Where a harness's host binaries and packages are mounted (read-only) in a container."""


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
            "PATH": launch.path,
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

    def sandbox_home_files(self, launch: Launch) -> dict[str, str]:
        """`home_files`, and a copy of the deployment's CA where the trust variables point on the host
        launchers (`_trust_proxy`)."""
        return {**self.home_files(launch), **_trust_files(launch)}

    def tools(self) -> tuple[tuple[Path, str], ...]:
        """(host path, path inside): what the harness needs in a container, mounted read-only."""
        return ()

    def container_mounts(self) -> tuple[tuple[Path, str], ...]:
        """What a container sandbox mounts read-only: `tools()`, and the deployment's CA when TLS is on
        (at `CA_INSIDE`, where `environment` points the harness's trust variables)."""
        identity = tls.current()
        return (*self.tools(), *(((identity.ca, CA_INSIDE),) if identity is not None else ()))

    def command(self, launch: Launch) -> list[str]:
        return [*self.argv(launch), *self.extra_args]

    def environment(self, launch: Launch) -> dict[str, str]:
        """What the sandbox gets: `runner.harness_env` under the harness's own variables, and the
        deployment's CA when the proxy speaks HTTPS (`gyre.tls`)."""
        return {**self.extra_env, **self.env(launch), **_trust_proxy(launch)}


TRUST_ENV = ("SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "CODEX_CA_CERTIFICATE")
"""Where the harnesses read extra CAs from: Python's ssl and httpx (the demo harness's SDK), Node.js
(Claude Code), Codex."""


CA_INSIDE = f"{TOOLS_INSIDE}/tls/ca.crt"
"""Where a container sandbox finds the deployment's CA (`HarnessCommand.container_mounts`)."""
CA_IN_HOME = ".gyre/ca.crt"
"""Where a host sandbox finds it: a copy in its HOME (`HarnessCommand.sandbox_home_files`). Not the
service's own file: that lies in the service's TLS directory beside its key, readable by the service's
group (a Kubernetes secret volume's 0440 + fsGroup), which a sandbox's uid is not in."""


def _proxy_ca(launch: Launch) -> Path | None:
    """The CA that signed the proxy's certificate, when the proxy speaks HTTPS (None otherwise)."""
    identity = tls.current()
    return identity.ca if identity is not None and launch.base_url.startswith("https://") else None


def _trust_files(launch: Launch) -> dict[str, str]:
    ca = _proxy_ca(launch)
    return {} if ca is None or launch.inside else {CA_IN_HOME: ca.read_text()}


def _trust_proxy(launch: Launch) -> dict[str, str]:
    """Where every harness finds the proxy's CA: its copy in the sandbox's HOME, or its read-only mount in
    a container."""
    if _proxy_ca(launch) is None:
        return {}
    return dict.fromkeys(TRUST_ENV, CA_INSIDE if launch.inside else str(launch.home / CA_IN_HOME))


class DemoHarness(HarnessCommand):
    """In a container it needs the image's python3 (3.11, the runner's ABI: Debian bookworm's): the
    harness package and the runner's site-packages (anthropic and what it imports) are mounted."""

    name = "demo"
    fork_module = "harness"
    fork_paths = (str(REPO_ROOT),)
    inside_paths = (f"{TOOLS_INSIDE}/python", f"{TOOLS_INSIDE}/site-packages")

    def argv(self, launch: Launch) -> list[str]:
        task = launch.task
        tools = ["--tools", ",".join(task.tools)] if task.tools else []
        # A seed per execution: tool-latency sleeps and retry jitter differ between the members of a group.
        seed = str(zlib.crc32(launch.execution_id.encode()))
        return [
            "python3" if launch.inside else sys.executable,
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
            "PYTHONPATH": os.pathsep.join(self.inside_paths if launch.inside else self.fork_paths),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def tools(self) -> tuple[tuple[Path, str], ...]:
        site = Path(sysconfig.get_paths()["purelib"])
        return ((REPO_ROOT / "harness", f"{self.inside_paths[0]}/harness"), (site, self.inside_paths[1]))


def _node_binary(name: str) -> str:
    local = REPO_ROOT / "node_modules" / ".bin" / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def _native(name: str, package: str, relative: str) -> Path:
    """The native binary of an npm CLI (what its `node_modules/.bin` entry starts): a container has no
    node, so the binary itself is mounted and run."""
    root = REPO_ROOT / "node_modules" / package
    found = root / relative
    if not found.exists():
        raise ValueError(f"{name}: {found} is missing (npm ci in the repository root installs it)")
    return found.resolve()


class ClaudeCodeHarness(HarnessCommand):
    """In a container: its native binary (glibc: the image must be glibc-based, e.g. Debian) mounted at
    /.gyre/tools/claude."""

    name = "claude_code"

    def argv(self, launch: Launch) -> list[str]:
        return [
            f"{TOOLS_INSIDE}/claude" if launch.inside else _node_binary("claude"),
            "-p",
            launch.prompt,
            "--output-format",
            "json",
            "--dangerously-skip-permissions",
        ]

    def env(self, launch: Launch) -> dict[str, str]:
        bin_dir = TOOLS_INSIDE if launch.inside else REPO_ROOT / "node_modules" / ".bin"
        return {
            **super().env(launch),
            "PATH": f"{bin_dir}:{launch.path}",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "IS_SANDBOX": "1",
        }

    def limits(self, limits: SandboxLimits) -> SandboxLimits:
        return replace(limits, memory_mb=None)  # JS runtimes reserve far more address space than they use

    def tools(self) -> tuple[tuple[Path, str], ...]:
        binary = _native("claude", "@anthropic-ai/claude-code", "bin/claude.exe")
        return ((binary, f"{TOOLS_INSIDE}/claude"),)


class CodexHarness(HarnessCommand):
    """In a container: its static (musl) binary and bundled ripgrep mounted at /.gyre/tools/codex."""

    name = "codex"

    def argv(self, launch: Launch) -> list[str]:
        return [
            f"{TOOLS_INSIDE}/codex/bin/codex" if launch.inside else _node_binary("codex"),
            "exec",
            "--skip-git-repo-check",
            "-s",
            "danger-full-access",
            "--json",
            launch.prompt,
        ]

    def env(self, launch: Launch) -> dict[str, str]:
        bin_dir = f"{TOOLS_INSIDE}/codex/codex-path" if launch.inside else REPO_ROOT / "node_modules" / ".bin"
        return {
            "PATH": f"{bin_dir}:{launch.path}",
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

    def tools(self) -> tuple[tuple[Path, str], ...]:
        vendor = _native("codex", "@openai/codex-linux-x64", "vendor/x86_64-unknown-linux-musl")
        return ((vendor, f"{TOOLS_INSIDE}/codex"),)


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
            "{python}": "python3" if launch.inside else sys.executable,
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


def check_harness(section: RunnerSection) -> type[HarnessCommand]:
    """The harness class `runner.harness` names; `ConfigError` listing the registry's names when it names none
    (`gyre up` before anything starts, and the runner at its start: exit 2)."""
    try:
        return HARNESSES[section.harness]
    except KeyError:
        raise ConfigError(
            f"runner.harness: {section.harness!r} is not a registered harness; available: {', '.join(HARNESSES)}"
        ) from None


def make_harness(section: RunnerSection) -> HarnessCommand:
    check_harness(section)
    if section.harness == CommandHarness.name:
        return CommandHarness(section.command, section.harness_args, section.harness_env)
    return HARNESSES[section.harness](section.harness_args, section.harness_env)
