"""A task's absolute environment paths in a sandbox: real paths in a container, bind mounts when a host
launcher can mount, else the paths rewritten.

Harbor tasks name absolute paths (gyre/tasks/harbor.py): the working directory (e.g. `/app`, where
the workspace is), `/tests`, `/logs/verifier`, `/logs/agent`.

- `container` launcher: the paths are the container's own (its image's WORKDIR); the workspace is
  copied in where the image does not hold it, and copied out when the harness ends
  (`container_layout`).

On the host launchers each path is a host directory:

- `isolated` launcher (root): the command runs in its own mount namespace, chrooted into a view of
  the host root in which each host directory is bind-mounted at its absolute path
  (gyre/sandbox/init.py, `enter_root`). Scripts, prompts and tools see exactly Harbor's
  paths; nothing on the host changes.
- `process` launcher (no root, no namespaces): the paths are rewritten to the host directories: in
  the prompt, in the verifier's copy of `tests/` (every UTF-8 text file) and in the verifier's
  environment; the command runs with the host workspace as its working directory. A path a script
  builds at run time (`"/" + "app"`) is not rewritten: run as root for exact paths.

    layout = harness_layout(task, workspace, bind=launcher.mounts_paths)    # the runner
    spec = SandboxSpec(..., cwd=layout.cwd, binds=layout.binds, argv=[..., layout.prompt])
    view = verifier_view(task, attempt_root, workspace_copy, bind=...)      # the evaluator
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gyre.tasks import Task
from gyre.tasks.dockerfile import DEFAULT_WORKDIR
from gyre.tasks.harbor import AGENT_LOGS_DIR, TESTS_DIR, VERIFIER_LOGS_DIR

_MAX_REWRITE_BYTES = 4 << 20


def agent_logs_of(workspace: Path) -> Path:
    """Where an execution's `/logs/agent` lives on the host: next to its workspace (kept with it)."""
    return workspace.with_name(workspace.name + ".agent-logs")


class PathMap:
    """Host directories given to a sandboxed command at absolute paths inside its environment."""

    def __init__(self, mounts: Sequence[tuple[Path, str]], bind: bool) -> None:
        for _, inside in mounts:
            if not inside.startswith("/") or inside == "/" or ".." in inside.split("/"):
                raise ValueError(f"an environment path must be absolute and below /; got {inside!r}")
        self.mounts = tuple((Path(host), inside.rstrip("/")) for host, inside in mounts)
        self.bind = bind
        # Longest inside path first, so /logs/verifier is replaced before a shorter prefix could be. A
        # whole path only: not /usr/app, /application or /app.d; a sentence's full stop may follow it.
        ordered = sorted(self.mounts, key=lambda m: len(m[1]), reverse=True)
        self._patterns = [
            (re.compile(rf"(?<![\w./-]){re.escape(inside)}(?![\w-])(?!\.\w)"), str(host))
            for host, inside in ordered
        ]

    def binds(self) -> tuple[tuple[Path, str], ...]:
        """The bind mounts for the sandbox (none when the paths are rewritten)."""
        return self.mounts if self.bind else ()

    def cwd(self, inside: str) -> Path:
        """The working directory as the command sees it."""
        if self.bind:
            return Path(inside)
        for host, path in self.mounts:
            if path == inside.rstrip("/"):
                return host
        raise KeyError(inside)

    def rewrite(self, text: str) -> str:
        """`text` with every mapped environment path replaced by its host directory (unchanged when bound)."""
        if self.bind:
            return text
        for pattern, host in self._patterns:
            text = pattern.sub(host.replace("\\", "\\\\"), text)
        return text

    def rewrite_tree(self, root: Path) -> list[Path]:
        """Rewrite the UTF-8 text files under `root` in place (a per-attempt copy); returns those changed."""
        changed: list[Path] = []
        if self.bind:
            return changed
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = Path(dirpath, name)
                if path.is_symlink() or not path.is_file() or path.stat().st_size > _MAX_REWRITE_BYTES:
                    continue
                try:
                    text = path.read_bytes().decode("utf-8")
                except UnicodeDecodeError:
                    continue
                new = self.rewrite(text)
                if new != text:
                    path.write_text(new)
                    changed.append(path)
        return changed


@dataclass(frozen=True, slots=True)
class HarnessLayout:
    """Where a harness runs for a task: its prompt as it sees it, its working directory, what it writes."""

    prompt: str
    cwd: Path
    writable: tuple[Path, ...]
    binds: tuple[tuple[Path, str], ...]
    agent_logs: Path | None
    """The host side of /logs/agent (tasks written for an environment only)."""
    copy_in: tuple[tuple[Path, str], ...] = ()
    """(host directory, path inside): what is copied into a container before the harness starts."""


def harness_layout(task: Task, workspace: Path, bind: bool) -> HarnessLayout:
    """A plain task runs in its workspace; a task written for an environment (Harbor) gets the
    workspace at its working directory and /logs/agent, mounted or rewritten."""
    workdir = task.environment.workdir
    if workdir is None:
        return HarnessLayout(task.prompt, workspace, (workspace,), (), None)
    logs = agent_logs_of(workspace)
    view = PathMap([(workspace, workdir), (logs, AGENT_LOGS_DIR)], bind)
    return HarnessLayout(view.rewrite(task.prompt), view.cwd(workdir), (workspace, logs), view.binds(), logs)


def container_layout(task: Task, workspace: Path) -> HarnessLayout:
    """A task in a container: its prompt as written, run in its working directory (the image's WORKDIR,
    `/app` for a task without an environment), the host workspace's contents copied there; /logs/agent
    comes back to the host next to the workspace."""
    workdir = task.environment.workdir or DEFAULT_WORKDIR
    return HarnessLayout(
        task.prompt, Path(workdir), (), (), agent_logs_of(workspace), ((workspace, workdir),)
    )


def verifier_view(task: Task, attempt_root: Path, workspace_copy: Path, bind: bool) -> PathMap:
    """A Harbor verifier attempt's paths: the workspace copy at the working directory, a fresh copy of
    `tests/` at /tests, empty /logs/verifier, the agent's logs at /logs/agent (all under `attempt_root`)."""
    workdir = task.environment.workdir or DEFAULT_WORKDIR
    return PathMap(
        [
            (workspace_copy, workdir),
            (attempt_root / "tests", TESTS_DIR),
            (attempt_root / "logs" / "verifier", VERIFIER_LOGS_DIR),
            (attempt_root / "logs" / "agent", AGENT_LOGS_DIR),
        ],
        bind,
    )
