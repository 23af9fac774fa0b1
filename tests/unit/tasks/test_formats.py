"""Contract of the task-format registry (`gyre.tasks.formats.TASK_FORMATS`), run for every name: a
directory in the format is recognized as it and only it, loads into a task whose `source` is the format's
name, and the same directory holding a second format's files is refused (naming both) instead of guessed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gyre.paths import REPO_ROOT
from gyre.tasks.directory import load_task_dir
from gyre.tasks.formats import TASK_FORMATS, formats_of, task_format
from gyre.tasks.problems import Problems


def _harbor(path: Path) -> None:
    shutil.copytree(REPO_ROOT / "examples" / "tasks" / "fix-add", path)


def _task_yaml(path: Path) -> None:
    path.mkdir()
    (path / "task.yaml").write_text('prompt: "Fix it."\nverifier: ["{python}", "{task_dir}/verify.py"]\n')


EXAMPLES = {"harbor": _harbor, "task.yaml": _task_yaml}
"""A minimal valid task directory of each registered format."""


def test_every_format_has_an_example() -> None:
    assert set(EXAMPLES) == set(TASK_FORMATS)


@pytest.mark.parametrize("name", sorted(TASK_FORMATS))
def test_a_directory_of_the_format_loads_as_it(name: str, tmp_path: Path) -> None:
    EXAMPLES[name](tmp_path / "t")
    assert [f.name for f in formats_of(tmp_path / "t")] == [name]
    problems = Problems()
    task = TASK_FORMATS[name].load(tmp_path / "t", "set/t", problems)
    assert task is not None and task.source == name and not problems.errors


@pytest.mark.parametrize("name", sorted(TASK_FORMATS))
def test_a_second_format_in_the_same_directory_is_refused(name: str, tmp_path: Path) -> None:
    EXAMPLES[name](tmp_path / "t")
    other = next(n for n in sorted(TASK_FORMATS) if n != name)
    EXAMPLES[other](tmp_path / "other")
    for item in (tmp_path / "other").iterdir():
        if not (tmp_path / "t" / item.name).exists():
            shutil.move(str(item), tmp_path / "t" / item.name)
    problems = Problems()
    assert load_task_dir(tmp_path / "t", "set/t", problems) is None
    assert "keep one format" in str(problems.errors[0]) and len(formats_of(tmp_path / "t")) == 2
    assert task_format(tmp_path / "nothing") is None
