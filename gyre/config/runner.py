"""Config sections of the runner (harness executions) and the evaluator (verifier runs), and of the
sandbox each runs its processes in.

The two sandboxes share one shape (`SandboxSection`) with their own defaults (the verifier's uids start
above the runner's range, and its processes get less CPU time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gyre.config.base import AtLeastOne, AtLeastOneOrNull, NonNegativeFloat, Port, PositiveFloat, Section

#: The local Debian base image `make setup` builds (deploy/local/containers.sh).
LOCAL_BASE_IMAGE = "localhost/gyre/debian-base:bookworm"

AUTO_LAUNCHER = "auto"
"""Not a launcher: `isolated` when the service runs as root, else `process`."""
LAUNCHER_NAMES = ("process", "isolated", "container")
"""The sandbox launchers by name, the keys of `LAUNCHERS` (gyre/sandbox/launchers/__init__.py), which maps each
to its class and asserts that the two agree. The names live here, below the sandbox, because the sandbox's
config is checked against them and the launchers import that config; add a launcher's name here and its
loader there."""


class ContainerSection(Section):
    """The `container` launcher: each sandbox a container of the task's own image, through the Docker
    Engine API (dockerd, or podman's API service)."""

    endpoint: str | None = None
    """The engine's API (`unix:///path.sock`, `tcp://host:port`); None = `DOCKER_HOST`, else podman's
    rootful socket /run/podman/podman.sock, else /var/run/docker.sock. The engine must run on this host
    (the runner enters its containers' network namespaces and reads their processes)."""
    default_image: str = LOCAL_BASE_IMAGE
    """The image of tasks without an environment of their own (built-in and task.yaml tasks). It must
    hold what the harness needs: `/bin/sh` always, python3 (3.11) for the demo harness."""
    user: str | None = None
    """The user commands run as inside the container (`uid[:gid]` or a name); None = the image's USER."""
    cpus: PositiveFloat | None = 1.0
    """CPUs per container (a CFS quota, not pinning); a task's `[environment] cpus` wins; None = no limit.
    A harness, its tools and its verifier are the policy's code: by default one container cannot take
    more than one core of the host."""
    userns: Literal["auto", "host"] = "auto"
    """`auto`: each container in a user namespace of its own (podman's `--userns=auto`: its root is an
    unprivileged uid range of the host's, from the `containers` entry of /etc/subuid and /etc/subgid,
    which `deploy/local/containers.sh setup` adds), so a process that escapes the container is nobody on
    the host — where the engine does it safely: podman ≥ 4.4 (4.3.1's API service can deadlock on it,
    containers/podman#16062), not dockerd (userns-remap is daemon-wide). Elsewhere the launcher logs why
    and containers share the host's user namespace. `host`: container root is host root."""
    storage_mb: AtLeastOneOrNull = None
    """Writable layer size per container where the engine's storage supports a quota; a task's
    `[environment] storage_mb` wins; None = no limit."""
    build_timeout_s: PositiveFloat = 600.0
    """Longest image build; a task's `[environment] build_timeout_sec` wins (Harbor's default is 600 s)."""
    api_timeout_s: PositiveFloat = 60.0
    """Longest single call to the engine's API (builds excepted)."""


class SandboxSection(Section):
    """How harness executions (runner) and verifier runs (evaluator) are sandboxed."""

    isolation: str = "auto"
    """The sandbox launcher, a name in the registry of `gyre.sandbox.launchers` (`LAUNCHER_NAMES`):
    `isolated` (own uid per slot, rlimits, network namespace with only the proxy relayed; root only),
    `process` (own process group, scrubbed env, rlimits), `container` (a container of the task's own
    image, its only network exit the proxy; `container:` below); `auto`: isolated when root, else process."""
    uid_base: int = 120000
    """First sandbox uid; slot k runs as uid_base + k (instance i of a service adds i * 1000)."""
    cpu_s: AtLeastOneOrNull = 3600
    """CPU seconds per process; None = unlimited."""
    memory_mb: AtLeastOneOrNull = 4096
    """Address space per process in MiB (RLIMIT_AS); None = unlimited (JS runtimes need that). For
    `container`: the memory of the whole container (a task's `[environment] memory_mb` wins)."""
    max_processes: AtLeastOneOrNull = 512
    """Processes and threads of one sandbox (RLIMIT_NPROC on its uid; the pids limit of a container)."""
    file_size_mb: AtLeastOneOrNull = 1024
    """Largest file a sandboxed process may write, MiB."""
    open_files: AtLeastOneOrNull = 1024
    """Open file descriptors per process."""
    kill_grace_s: NonNegativeFloat = 5.0
    """Seconds between SIGTERM and SIGKILL when a sandbox is stopped."""
    container: ContainerSection = Field(default_factory=ContainerSection)
    """Settings of the `container` launcher."""

    @field_validator("isolation")
    @classmethod
    def _registered(cls, v: str) -> str:
        names = (AUTO_LAUNCHER, *LAUNCHER_NAMES)
        if v not in names:
            raise ValueError(f"{v!r} is not a sandbox launcher; choose one of {', '.join(names)}")
        return v

    @field_validator("uid_base")
    @classmethod
    def _uid_base(cls, v: int) -> int:
        if not 1000 <= v <= 2**31 - 100_000:
            raise ValueError(f"uid_base must be in [1000, 2^31 - 100000] (unused uids); got {v}")
        return v


class RunnerSandboxSection(SandboxSection):
    """Sandbox of harness executions."""

    uid_base: int = 120000
    """First sandbox uid; slot k runs as uid_base + k (instance i adds i * 1000). Keep the runner's and
    the evaluator's ranges apart."""
    copy_out_max_bytes: AtLeastOne = 1 << 30
    """Bytes of file content (and symlink targets) the host keeps of an execution after its harness (its
    workspace and /logs/agent together): copied out of its container (`container`: the copy stops at the
    cap), or measured in place (host launchers). Past it nothing of them is kept and the execution ends
    FAILED with the reason (the harness is the policy's code)."""
    copy_out_max_files: AtLeastOne = 100_000
    """Files, directories and symlinks the host keeps of an execution after its harness (its workspace and
    /logs/agent together); past it as `copy_out_max_bytes`."""


class VerifierSandboxSection(SandboxSection):
    """Sandbox of verifier runs (no network at all, whatever `isolation` says about the proxy)."""

    uid_base: int = 130000
    """First verifier uid; slot k runs as uid_base + k (instance i adds i * 1000)."""
    cpu_s: AtLeastOneOrNull = 600
    """CPU seconds per verifier process; None = unlimited."""


def _task_dirs_moved(data: Any, section: str) -> Any:
    if isinstance(data, dict) and "task_dirs" in data:
        raise ValueError(
            f"{section}.task_dirs moved to tasks.dirs (one `tasks:` section for every service); "
            "move the list there"
        )
    return data


HARNESS_ROUTING_ENV = frozenset(
    {"ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY", "CODEX_HOME", "HOME"}
)
"""Variables the runner sets so that every model call of a harness reaches the proxy under its execution's key."""


class RunnerSection(Section):
    port: Port = 0
    """gRPC port; 0 picks a free one."""
    max_concurrent: AtLeastOne = 32
    """Executions this runner keeps running at once."""
    harness: str = "demo"
    """Which harness command the runner launches, a name in the registry of `services.runner.harnesses`
    (`HARNESSES`): `demo`, `claude_code`, `codex`, `command` (= the argv in `command`). Checked against the
    registry by `gyre up` and at the runner's start (`check_harness`), not when the config is read."""
    fork_server: bool = True
    """Fork executions of a `python -m` harness (the demo harness) from one pre-imported interpreter
    instead of starting a new one each time (its imports cost ~3 CPU-s); same sandbox, same isolation."""
    harness_args: list[str] = Field(default_factory=list)
    """Extra arguments appended to the harness command (e.g. `--tool-latency-s 2` for the demo)."""
    harness_env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables of the harness (its own settings, e.g. Claude Code's
    `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE`); the variables that route it to the proxy cannot be set here."""
    command: list[str] = Field(default_factory=list)
    """argv of the `command` harness; `{prompt}`, `{task_id}`, `{execution_id}`, `{python}` are expanded."""
    workspace_dir: Path | None = None
    """Where workspaces are created; None = `<run dir>/workspaces`."""
    sandbox: RunnerSandboxSection = Field(default_factory=RunnerSandboxSection)
    """Sandbox of harness executions."""
    on_stop: Literal["cancel", "detach"] = "cancel"
    """At shutdown: cancel running executions (terminated, CANCELLED) or leave them running for
    the next incarnation of this runner to adopt."""
    open_attempts: AtLeastOne = 3
    """OpenExecution attempts on the proxy before a start fails as INFRA_FAILURE (at least; see open_retry_s)."""
    open_retry_s: NonNegativeFloat = 60.0
    """An unreachable proxy (restarting after a crash) is asked again for this many seconds before a start
    fails as INFRA_FAILURE, however many attempts that takes."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        return _task_dirs_moved(data, "runner")

    @model_validator(mode="after")
    def _command_given(self) -> RunnerSection:
        if self.harness == "command" and not self.command:
            raise ValueError("harness `command` needs runner.command (an argv, e.g. [bash, -c, '{prompt}'])")
        routed = sorted(HARNESS_ROUTING_ENV & set(self.harness_env))
        if routed:
            raise ValueError(
                f"runner.harness_env cannot set {', '.join(routed)}: the runner routes the harness to the proxy"
            )
        return self


class EvaluatorSection(Section):
    port: Port = 0
    """gRPC port; 0 picks a free one."""
    max_attempts: AtLeastOne = 3
    """Verifier attempts on one preserved workspace before the execution is excluded."""
    backoff_s: NonNegativeFloat = 0.5
    """First retry delay; doubles each attempt, bounded by the execution's overall budget."""
    max_concurrent: AtLeastOne = 4
    """Verifier runs at once."""
    work_dir: Path | None = None
    """Where verifier attempts copy workspaces; None = `<run dir>/evaluations`."""
    sandbox: VerifierSandboxSection = Field(default_factory=VerifierSandboxSection)
    """Sandbox of verifier runs (network: none)."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        return _task_dirs_moved(data, "evaluator")
