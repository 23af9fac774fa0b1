"""Tasks, the framework's contract for what executions do and how they are scored.

    task.py        Task, Verifier, TaskEnvironment, WorkspaceSource, TaskSuite, path safety
    builtin/       built-in suites (the arithmetic tasks the demo trains on)
    harbor.py      Harbor task directories (instruction.md, task.toml, environment/, tests/test.sh)
    yaml_task.py   Gyre's own task.yaml directories
    directory.py   a task directory or a set of them as a suite
    dataset.py     JSONL datasets of task references with weights
    registry.py    id → task over all suites
    taskset.py     a run's tasks from its `tasks:` config section: registry + weighted queries
    sampling.py    the weighted, interleaved cycle queries are drawn from
    problems.py    defects named with their path (`gyre tasks check`)

The scheduler, runner and evaluator build one `TaskSet` each from the same config section.
"""

from gyre.tasks.builtin import BUILTIN_SUITES, demo_task_ids
from gyre.tasks.problems import Problem, Problems
from gyre.tasks.registry import TaskRegistry
from gyre.tasks.task import (
    Task,
    TaskEnvironment,
    TaskError,
    TaskSuite,
    UnknownTaskError,
    Verifier,
    WorkspaceSource,
    check_relative,
)
from gyre.tasks.taskset import Query, TaskSet

__all__ = [
    "BUILTIN_SUITES",
    "Problem",
    "Problems",
    "Query",
    "Task",
    "TaskEnvironment",
    "TaskError",
    "TaskRegistry",
    "TaskSet",
    "TaskSuite",
    "UnknownTaskError",
    "Verifier",
    "WorkspaceSource",
    "check_relative",
    "demo_task_ids",
]
