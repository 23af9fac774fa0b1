"""Problems found in task files, each named with its path: what `gyre tasks check` prints and what
a run's start refuses with.

    problems = Problems()
    problems.error(task_dir / "task.toml", "[agent] timeout_sec: must be a positive number; got -5")
    problems.raise_errors()          # TaskError("…/task.toml: [agent] timeout_sec: …") when any error

Warnings are things a local run cannot reproduce (e.g. a Dockerfile's RUN steps); they never stop a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gyre.tasks.task import TaskError

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Problem:
    path: Path
    """The file (or directory) at fault."""
    message: str
    """What is wrong and, where it helps, the fix; a key is named as `[table] key`."""
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class Problems(list[Problem]):
    """Problems collected while loading or checking tasks, in the order found."""

    def error(self, path: Path, message: str) -> None:
        self.append(Problem(path, message, "error"))

    def warn(self, path: Path, message: str) -> None:
        self.append(Problem(path, message, "warning"))

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self if p.severity == "warning"]

    def raise_errors(self) -> None:
        """`TaskError` naming every error (file and key), if there is any."""
        if self.errors:
            raise TaskError("; ".join(str(p) for p in self.errors))
