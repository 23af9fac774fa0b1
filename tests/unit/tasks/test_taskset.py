"""A run's task set from one `tasks:` section: what is dispatched (queries, datasets, dirs, the
built-in default), with which weights, and every defect named with its file (and line or key)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from gyre.config import ConfigError, load_config
from gyre.config.tasks import TasksSection
from gyre.tasks import TaskError, TaskSet
from gyre.tasks.sampling import WeightedCycle

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "tasks" / "fix-add"


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A task.yaml set `mine` (echo, copy) and a Harbor set `harbor` (fix-add, a second copy)."""
    mine = tmp_path / "mine"
    for name in ("echo", "copy"):
        (mine / name).mkdir(parents=True)
        (mine / name / "task.yaml").write_text(f'prompt: "{name}"\nverifier: ["true"]\n')
    harbor = tmp_path / "harbor"
    shutil.copytree(EXAMPLE, harbor / "fix-add")
    shutil.copytree(EXAMPLE, harbor / "fix-add-2")
    return mine, harbor


def ids(task_set: TaskSet) -> list[tuple[str, float]]:
    return [(q.task_id, q.weight) for q in task_set.queries]


def test_nothing_configured_dispatches_the_builtin_arithmetic_suites() -> None:
    task_set = TaskSet.from_section(TasksSection())
    assert len(task_set.queries) == 112 and {q.source for q in task_set.queries} == {"builtin"}


def test_dirs_alone_dispatch_every_task_of_them(dirs: tuple[Path, Path]) -> None:
    mine, harbor = dirs
    task_set = TaskSet.from_section(TasksSection(dirs=[mine, harbor]))
    assert ids(task_set) == [
        ("mine/copy", 1.0),
        ("mine/echo", 1.0),
        ("harbor/fix-add", 1.0),
        ("harbor/fix-add-2", 1.0),
    ]
    assert task_set.queries[0].source == f"dir {mine}"
    assert task_set.registry.get("add/3+5").task_id == "add/3+5"  # built-ins stay resolvable


def test_queries_datasets_and_weights(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    mine, harbor = dirs
    data = tmp_path / "data" / "train.jsonl"
    data.parent.mkdir()
    (data.parent / "extra").mkdir()
    shutil.copytree(EXAMPLE, data.parent / "extra" / "fix-extra")
    data.write_text(
        '# a comment\n{"task": "harbor/fix-add", "weight": 3}\n{"task": "extra/fix-extra"}\n'
        '{"task": "mine/echo"}\n'
    )
    section = TasksSection(
        dirs=[mine, harbor],
        datasets=[data],
        queries=["add/3+5", "mine"],
        weights={"mine": 0.5, "mine/copy": 4.0, "extra/fix-extra": 0},
    )
    task_set = TaskSet.from_section(section)
    assert ids(task_set) == [
        ("harbor/fix-add", 3.0),
        ("extra/fix-extra", 0.0),
        ("mine/echo", 1.0),
        ("add/3+5", 1.0),
        ("mine/copy", 4.0),
    ]
    echo = next(q for q in task_set.queries if q.task_id == "mine/echo")
    assert (
        echo.source == f"{data}:4, tasks.queries"
    )  # listed twice: weights add up (0.5 from the line's suite + 0.5)
    assert task_set.registry.get("extra/fix-extra").source == "harbor"  # a path line registers its directory
    cycle = task_set.cycle(seed=3)
    draws = Counter(cycle.next() for _ in range(90))
    assert draws == {"harbor/fix-add": 30, "mine/copy": 40, "mine/echo": 10, "add/3+5": 10}


def test_every_defect_is_named_with_its_file(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    mine, harbor = dirs
    toml = harbor / "fix-add" / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 60.0", 'timeout_sec = "60"'))
    data = tmp_path / "d.jsonl"
    data.write_text('{"task": "nosuch/x"}\n{"task": "mine/echo", "weight": "heavy"}\n')
    section = TasksSection(
        dirs=[mine, harbor, tmp_path / "absent"],
        datasets=[data],
        queries=["mine/nope", "zzz", "harbor"],
        weights={"ghost": 1.0},
    )
    with pytest.raises(TaskError) as e:
        TaskSet.from_section(section)
    message = str(e.value)
    for want in (
        f"{tmp_path / 'absent'}: task directory does not exist",
        f"{data}:1: 'nosuch/x': no suite 'nosuch'",
        f"{data}:2: weight: must be a number >= 0; got 'heavy'",
        "tasks.queries: 'zzz' is neither a task id (<suite>/<name>) nor a suite",
        "unknown task 'mine/nope': no task directory 'nope'",
        f"{toml.resolve()}: [verifier] timeout_sec: must be a positive number of seconds; got '60'",
        "tasks.weights: 'ghost' names no dispatched task or suite",
    ):
        assert want in message, (want, message)


def test_suite_names_must_not_collide(tmp_path: Path) -> None:
    (tmp_path / "add" / "t").mkdir(parents=True)
    (tmp_path / "add" / "t" / "task.yaml").write_text('prompt: "x"\n')
    with pytest.raises(
        TaskError, match="suite name 'add' is taken by a built-in suite; rename the directory"
    ):
        TaskSet.from_section(TasksSection(dirs=[tmp_path / "add"]))


def test_single_task_dirs_of_one_set_share_its_suite(dirs: tuple[Path, Path]) -> None:
    _, harbor = dirs
    task_set = TaskSet.from_section(TasksSection(dirs=[harbor / "fix-add-2", harbor / "fix-add"]))
    assert ids(task_set) == [("harbor/fix-add", 1.0), ("harbor/fix-add-2", 1.0)]


def test_nothing_to_dispatch_is_refused_by_the_cycle(dirs: tuple[Path, Path]) -> None:
    mine, _ = dirs
    task_set = TaskSet.from_section(TasksSection(dirs=[mine], weights={"mine": 0}))
    with pytest.raises(TaskError, match="the run would dispatch nothing"):
        task_set.cycle(0)


def test_weighted_cycle_is_exact_interleaved_and_seeded() -> None:
    cycle = WeightedCycle([("a", 1.0), ("b", 1.0), ("c", 1.0)], seed=0)
    first = [cycle.next() for _ in range(3)]
    assert sorted(first) == ["a", "b", "c"] and [cycle.next() for _ in range(3)] == first
    cycle = WeightedCycle([("a", 2.5), ("b", 0.5), ("z", 0.0)], seed=1)
    draws = [cycle.next() for _ in range(60)]
    assert Counter(draws) == {"a": 50, "b": 10}
    assert all(
        Counter(draws[:n])["a"] - n * 2.5 / 3 < 1.01 for n in range(1, 61)
    )  # never ahead by more than one
    with pytest.raises(ValueError, match="positive weight"):
        WeightedCycle([("a", 0.0)], seed=0)


def test_the_moved_keys_name_their_new_place() -> None:
    for overrides, want in (
        ({"scheduler": {"tasks": ["add"]}}, "scheduler.tasks moved to tasks.queries"),
        ({"runner": {"task_dirs": ["x"]}}, "runner.task_dirs moved to tasks.dirs"),
        ({"evaluator": {"task_dirs": ["x"]}}, "evaluator.task_dirs moved to tasks.dirs"),
        (
            {"tasks": {"weights": {"add": -1}}},
            "tasks.weights: weight of 'add' must be a number >= 0; got -1.0",
        ),
        (
            {"tasks": {"queries": ["add 3"]}},
            "tasks.queries: a query is a task id or suite name without whitespace",
        ),
    ):
        with pytest.raises(ConfigError, match=want.replace(".", r"\.").replace("(", r"\(")):
            load_config(None, environ={}, overrides=overrides)


def test_a_same_container_verifier_needs_the_runs_consent(dirs: tuple[Path, Path]) -> None:
    """A task asking for Harbor's same-container verifier (where the harness can change its grader) stops
    the run's start, named, unless the run allows it; then the task set lists it (the summary says so)."""
    _, harbor = dirs
    toml = harbor / "fix-add-2" / "task.toml"
    toml.write_text(toml.read_text().replace("[verifier]\n", "[verifier]\nsame_container = true\n"))
    with pytest.raises(TaskError) as e:
        TaskSet.from_section(TasksSection(dirs=[harbor]))
    assert str(e.value) == (
        "harbor/fix-add-2: [verifier] same_container = true runs the grader where the harness ran, so the "
        "harness can change what scores it; allow it for this run with tasks.allow_same_container_verifier: true"
    )
    allowed = TaskSet.from_section(TasksSection(dirs=[harbor], allow_same_container_verifier=True))
    assert allowed.same_container_tasks() == ["harbor/fix-add-2"]
    assert (
        TaskSet.from_section(TasksSection(dirs=[harbor], queries=["harbor/fix-add"])).same_container_tasks()
        == []
    )
