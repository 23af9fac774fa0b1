"""JSONL datasets of task references: one task a line, with an optional sampling weight.

    {"task": "tasks/fix-add", "weight": 2.0}        a task id (a built-in or a configured suite)
    {"task": "fix-add"}                              a task directory, relative to the dataset file
    {"task": "/data/tb2/hello-world", "weight": 0.5} an absolute task directory

A path entry registers its task directory (its parent is the suite, as for `tasks.dirs`); an entry
that contains no '/' and names no directory is read as a suite name. Blank lines and lines starting
with `#` are skipped. Every defect names the file and line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from gyre.tasks.formats import task_format
from gyre.tasks.problems import Problems

KEYS = {"task", "weight"}


@dataclass(frozen=True, slots=True)
class DatasetEntry:
    reference: str
    """A task id or a suite name (when `directory` is None)."""
    weight: float | None
    """None when the line gives none (then `tasks.weights` or 1.0 applies)."""
    directory: Path | None
    """The task directory a path entry names."""
    where: str
    """`file:line`, for messages and `gyre tasks list`."""


def read_dataset(path: Path, problems: Problems) -> list[DatasetEntry]:
    """The entries of a JSONL dataset; defects (naming file:line and key) go to `problems`."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        problems.error(path, f"cannot read the dataset: {e}")
        return []
    entries: list[DatasetEntry] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except ValueError as e:
            problems.error(Path(where), f"not a JSON object: {e}")
            continue
        if not isinstance(item, dict):
            problems.error(
                Path(where),
                f'must be a JSON object like {{"task": "suite/id", "weight": 1.0}}; got {line[:80]}',
            )
            continue
        unknown = sorted(set(item) - KEYS)
        if unknown:
            problems.error(Path(where), f"{', '.join(unknown)}: unknown key; allowed: task, weight")
        ref = item.get("task")
        if not isinstance(ref, str) or not ref.strip():
            problems.error(Path(where), "task: required, a task id or a task directory")
            continue
        weight = item.get("weight")
        if weight is not None and (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not math.isfinite(weight)
            or weight < 0
        ):
            problems.error(Path(where), f"weight: must be a number >= 0; got {weight!r}")
            continue
        candidate = Path(ref) if Path(ref).is_absolute() else path.parent / ref
        directory = candidate if candidate.is_dir() and task_format(candidate) is not None else None
        if directory is None and (Path(ref).is_absolute() or ref.startswith(".")):
            problems.error(
                Path(where),
                f"task: {ref!r} is not a task directory (no task.toml, instruction.md or task.yaml)",
            )
            continue
        if not unknown:
            entries.append(DatasetEntry(ref, None if weight is None else float(weight), directory, where))
    return entries
