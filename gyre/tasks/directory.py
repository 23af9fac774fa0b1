"""On-disk tasks: a directory that is one task, or a set of tasks (one per subdirectory).

A task directory is in one of the formats of gyre/tasks/formats.py: Harbor's (`task.toml` /
`instruction.md` / `tests/test.sh`, gyre/tasks/harbor.py) or Gyre's own (`task.yaml`,
gyre/tasks/yaml_task.py). A set is a suite
named after its directory, its tasks `<set name>/<task dir name>`; a single task directory given on
its own belongs to the suite named after its parent:

    DirectorySuite(Path("examples/tasks"))             # examples/tasks/fix-add → tasks/fix-add
    DirectorySuite(Path("examples/tasks/fix-add"))     # the one task tasks/fix-add

Tasks are re-read on every `get`, so edits take effect in a running stack.
"""

from __future__ import annotations

from pathlib import Path

from gyre.tasks.formats import TASK_FORMATS, formats_of, task_format
from gyre.tasks.problems import Problems
from gyre.tasks.task import Task, TaskError, TaskSuite, UnknownTaskError


def load_task_dir(task_dir: Path, task_id: str, problems: Problems) -> Task | None:
    """The task in `task_dir` (in the format it holds), or None with its defects appended to `problems`."""
    found = formats_of(task_dir)
    if len(found) > 1:
        both = " and ".join(f.files for f in reversed(found))
        problems.error(task_dir, f"holds both {both}; keep one format")
        return None
    if found:
        return found[0].load(task_dir, task_id, problems)
    kinds = " and ".join(f"no {f.files}" for f in TASK_FORMATS.values())
    problems.error(task_dir, f"not a task: {kinds}")
    return None


def _valid_name(name: str) -> bool:
    return bool(name) and not name.startswith(".") and not any(c.isspace() or c == "/" for c in name)


class DirectorySuite(TaskSuite):
    """The tasks under a set directory `root`, or only the ones named in `only`."""

    def __init__(self, path: Path) -> None:
        """`path` is a set of task directories, or one task directory (then the suite is its parent, with
        only that task in it)."""
        if not path.is_dir():
            raise TaskError(f"{path}: task directory does not exist")
        resolved = path.resolve()
        single = task_format(resolved) is not None
        self.display = path.parent if single else path
        self.root = resolved.parent if single else resolved
        self.only: set[str] | None = {resolved.name} if single else None
        self.name = self.root.name
        if not _valid_name(self.name):
            raise TaskError(f"{path}: {self.name!r} cannot name a suite (no whitespace, '/' or leading '.')")

    def merge(self, other: DirectorySuite) -> None:
        """Take in the tasks of `other`, a suite of the same set directory."""
        assert other.root == self.root
        self.only = None if self.only is None or other.only is None else self.only | other.only

    def names(self) -> list[str]:
        """Task directory names of the suite (format detected, contents not checked)."""
        found = sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and _valid_name(p.name) and task_format(p) is not None
        )
        return found if self.only is None else [n for n in found if n in self.only]

    def task_ids(self) -> list[str]:
        return [f"{self.name}/{n}" for n in self.names()]

    def get(self, name: str) -> Task:
        problems = Problems()
        task = self.load(name, problems)
        problems.raise_errors()
        assert task is not None
        return task

    def load(self, name: str, problems: Problems) -> Task | None:
        """Like `get`, with defects and warnings appended to `problems` instead of raised."""
        if name not in self.names():
            raise UnknownTaskError(f"no task directory {name!r} in {self.display}")
        return load_task_dir(self.root / name, f"{self.name}/{name}", problems)

    def check(self) -> Problems:
        """Every defect of every task of the suite (what `gyre tasks check` prints)."""
        problems = Problems()
        if self.only is None:
            for p in sorted(self.root.iterdir()):
                if p.is_dir() and not p.name.startswith(".") and task_format(p) is None:
                    problems.warn(
                        self.display / p.name,
                        "not a task directory (no task.toml, instruction.md or task.yaml); skipped",
                    )
            if not self.names():
                problems.error(self.display, "holds no task directories")
        for name in self.names():
            load_task_dir(self.display / name, f"{self.name}/{name}", problems)
        return problems
