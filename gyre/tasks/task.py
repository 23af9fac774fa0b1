"""The task contract: what an execution is asked to do, what its workspace starts with, and how its
preserved workspace is scored.

A task is a prompt, a workspace (files copied in before the harness starts), a verifier, a harness
timeout and an overall budget; optionally the environment it was written for (a container image,
the absolute working directory inside it) and free metadata. The runner builds workspaces and
launches harnesses from it, the evaluator runs its verifier on the preserved workspace after any
termination, the scheduler draws queries from task ids: all three resolve ids through one registry
built from the `tasks:` config section (`gyre.tasks.registry`, `gyre.tasks.taskset`).

Verifier protocols (`Verifier.protocol`):

    score_line   the verifier runs in a copy of the workspace and prints `{"score": x}` with x in
                 [0, 1] as its last stdout line. Arguments may use `{python}` (the evaluating
                 interpreter) and `{task_dir}` (the directory the task was loaded from).
    harbor       Harbor's convention (gyre/tasks/harbor.py): `tests/` is given at /tests, the script
                 runs from the environment's working directory and writes its reward to
                 /logs/verifier/reward.txt (a number) or reward.json; reward.txt is read first.

Either way a failed attempt (crash, no score or reward, a timeout) is *pending*, never a zero.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from gyre.errors import StartupError

DEFAULT_HARNESS_TIMEOUT_S = 120.0
DEFAULT_OVERALL_BUDGET_S = 300.0
DEFAULT_VERIFIER_TIMEOUT_S = 30.0

VerifierProtocol = Literal["score_line", "harbor"]


class TaskError(StartupError):
    """A task (or a task set) is malformed; the message names the file and the key."""


class UnknownTaskError(TaskError):
    """No suite knows the task id (the runner terminates such a start request as INFRA_FAILURE)."""


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class WorkspaceSource:
    """A file or directory copied into the workspace before the harness starts."""

    source: Path
    """On the host; a directory's contents are merged into `target`."""
    target: str = ""
    """Workspace-relative destination ("" = the workspace root)."""


@dataclass(frozen=True, slots=True)
class Verifier:
    """How a preserved workspace is scored."""

    argv: tuple[str, ...] = ()
    """The command; empty = nothing can score this task (its executions are excluded)."""
    timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    """Wall-clock limit of one attempt (a timeout is a failed attempt, i.e. pending)."""
    env: Mapping[str, str] = field(default_factory=_empty)
    """Extra environment of the verifier; `${NAME}` and `${NAME:-default}` are taken from the
    evaluator's environment when the attempt starts."""
    protocol: VerifierProtocol = "score_line"
    """How the result is read: a score line on stdout, or Harbor's reward files."""
    tests_dir: Path | None = None
    """Harbor: the task's `tests/`, copied afresh for every attempt and given at /tests."""
    same_container: bool = False
    """Harbor order, opt-in (`[verifier] same_container = true`, allowed by the run's
    `tasks.allow_same_container_verifier`): the verifier runs in the execution's own container, after the
    harness, so it sees state outside the workspace, and whatever the harness changed there (the grader
    included). Default: a fresh container of the task's built image with the preserved workspace copied in."""
    agent_paths: tuple[str, ...] | None = None
    """The paths (relative to the working directory) that are the agent's work: only these are carried
    from the preserved workspace into the verifier's fresh container, the rest is the image's. None: the
    whole working directory is carried."""


@dataclass(frozen=True, slots=True)
class TaskEnvironment:
    """The environment a task was written for. The `container` launcher runs the task in `docker_image`,
    else in the image built from `dockerfile`, with these resources; the host launchers run it on the
    host's tools, with the workspace at `workdir` when they can mount it there
    (gyre/sandbox/task_paths.py)."""

    workdir: str | None = None
    """Absolute working directory inside the environment (the Dockerfile's WORKDIR, e.g. /app);
    None = the workspace is the working directory wherever it lies."""
    dockerfile: Path | None = None
    docker_image: str | None = None
    build_timeout_s: float | None = None
    cpus: int | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = None
    allow_internet: bool | None = None

    def resources(self) -> dict[str, float]:
        """The resources this environment asks for (`cpus`, `memory_mb`, `storage_mb`, `gpus`), those it sets."""
        asked = {
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "storage_mb": self.storage_mb,
            "gpus": self.gpus,
        }
        return {k: float(v) for k, v in asked.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Task:
    """One query: the unit a group of N executions samples."""

    task_id: str
    """Unique id, `<suite>/<name>` (also the query id of its groups)."""
    prompt: str
    """What the harness is asked to do."""
    files: Mapping[str, str] = field(default_factory=_empty)
    """Workspace files written after `workspace`: relative path → text content."""
    workspace: tuple[WorkspaceSource, ...] = ()
    """Files and directories copied into the workspace, in order (later ones overwrite)."""
    verifier: Verifier = field(default_factory=Verifier)
    harness_timeout_s: float = DEFAULT_HARNESS_TIMEOUT_S
    """Harness time limit: past it the harness is stopped, the workspace preserved and scored."""
    overall_budget_s: float = DEFAULT_OVERALL_BUDGET_S
    """Harness plus evaluation retries; past it an execution without a valid score is excluded."""
    tools: tuple[str, ...] | None = None
    """Tools a harness that can restrict its tool set offers for this task (None = its default set).
    Every tool definition is part of every request, so a task that needs one tool keeps contexts short."""
    task_dir: Path | None = None
    """Directory the task was loaded from (on-disk tasks), substituted for `{task_dir}`."""
    environment: TaskEnvironment = field(default_factory=TaskEnvironment)
    metadata: Mapping[str, Any] = field(default_factory=_empty)
    """Free-form (Harbor's [metadata] and [task] tables); never read by the training path."""
    source: str = "builtin"
    """Where the task comes from: `builtin`, `task.yaml` or `harbor`."""

    def __post_init__(self) -> None:
        if not self.task_id or any(c.isspace() for c in self.task_id):
            raise TaskError(f"task id must be non-empty without whitespace; got {self.task_id!r}")
        if not self.harness_timeout_s > 0 or not self.verifier.timeout_s > 0:
            raise TaskError(f"task {self.task_id}: timeouts must be positive")
        if self.overall_budget_s < self.harness_timeout_s:
            raise TaskError(
                f"task {self.task_id}: overall_budget_s ({self.overall_budget_s}) must be at least "
                f"harness_timeout_s ({self.harness_timeout_s}); the budget covers the harness and its evaluation"
            )
        try:
            for rel in [*self.files, *(src.target for src in self.workspace if src.target)]:
                check_relative(rel)
        except ValueError as e:
            raise TaskError(f"task {self.task_id}: {e}") from None
        workdir = self.environment.workdir
        if workdir is not None and (
            not workdir.startswith("/") or workdir == "/" or ".." in workdir.split("/")
        ):
            raise TaskError(
                f"task {self.task_id}: the working directory must be an absolute path below /; got {workdir!r}"
            )

    def verifier_argv(self, python: str) -> list[str]:
        """The verifier command with `{python}` and `{task_dir}` expanded."""
        task_dir = str(self.task_dir) if self.task_dir else ""
        return [arg.replace("{python}", python).replace("{task_dir}", task_dir) for arg in self.verifier.argv]


def check_relative(rel: str) -> Path:
    """A workspace-relative path that cannot escape the workspace; `ValueError` otherwise."""
    path = Path(rel)
    if not rel or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"workspace paths must be relative without '..'; got {rel!r}")
    return path


class TaskSuite(ABC):
    """A named family of tasks; ids are `<suite name>/<name>`. See `gyre.tasks.registry`."""

    name: str

    @abstractmethod
    def task_ids(self) -> list[str]:
        """Every task id of the suite (the queries a run can dispatch)."""

    @abstractmethod
    def get(self, name: str) -> Task:
        """The task `<suite>/<name>`; `UnknownTaskError` when the suite has no such task, `TaskError`
        when its files are malformed."""
