"""Task directory formats, by name: how a directory is recognized as one task and read into a `Task`.

    fmt = task_format(path)                            # the format whose files `path` holds, or None
    task = fmt.load(path, "tasks/fix-add", problems)   # None, with the defects in `problems`

A format is recognized by its own files (`detect`), and a directory that holds the files of two formats
is refused: which one it means is not for Gyre to guess. To add a format: subclass `TaskFormat` (its
`name`, a `files` phrase for error messages, `detect` and `load`; the loader in a module of its own, as
gyre/tasks/harbor.py and gyre/tasks/yaml_task.py are) and add an instance to `TASK_FORMATS`; the contract
test tests/unit/tasks/test_formats.py runs every registered format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from gyre.tasks.harbor import is_harbor_dir, load_harbor_task
from gyre.tasks.problems import Problems
from gyre.tasks.task import Task
from gyre.tasks.yaml_task import TASK_YAML, load_yaml_task


class TaskFormat(ABC):
    name: ClassVar[str]
    files: ClassVar[str]
    """The files that make a directory a task of this format (for messages)."""

    @abstractmethod
    def detect(self, path: Path) -> bool:
        """`path` holds this format's files."""

    @abstractmethod
    def load(self, task_dir: Path, task_id: str, problems: Problems) -> Task | None:
        """The task in `task_dir`, or None with its defects appended to `problems`."""


class HarborFormat(TaskFormat):
    """Harbor's task directories (gyre/tasks/harbor.py)."""

    name = "harbor"
    files = "Harbor files (task.toml, instruction.md)"

    def detect(self, path: Path) -> bool:
        return is_harbor_dir(path)

    def load(self, task_dir: Path, task_id: str, problems: Problems) -> Task | None:
        return load_harbor_task(task_dir, task_id, problems)


class YamlFormat(TaskFormat):
    """Gyre's own `task.yaml` (gyre/tasks/yaml_task.py)."""

    name = "task.yaml"
    files = TASK_YAML

    def detect(self, path: Path) -> bool:
        return (path / TASK_YAML).is_file()

    def load(self, task_dir: Path, task_id: str, problems: Problems) -> Task | None:
        return load_yaml_task(task_dir, task_id, problems)


TASK_FORMATS: dict[str, TaskFormat] = {f.name: f for f in (HarborFormat(), YamlFormat())}
"""name → format, in the order a directory is recognized."""


def formats_of(path: Path) -> list[TaskFormat]:
    """Every registered format whose files `path` holds."""
    return [f for f in TASK_FORMATS.values() if f.detect(path)]


def task_format(path: Path) -> TaskFormat | None:
    """The format of a task directory (the first that recognizes it), None when `path` is not one."""
    return next(iter(formats_of(path)), None)
