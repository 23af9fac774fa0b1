"""The tasks of a run, from its `tasks:` config section: the registry every service resolves ids
with, and the weighted queries the scheduler dispatches.

    task_set = TaskSet.from_section(config.tasks)      # TaskError naming file and key on any defect
    task_set.registry.get("tasks/fix-add")
    task_set.queries                                     # [Query("tasks/fix-add", 1.0, "dir examples/tasks"), ...]
    cycle = task_set.cycle(seed=0)                       # the scheduler's draws

What is dispatched: the `queries` (ids and suite names) and the datasets' lines; when neither is
given, every task of `dirs`, or the built-in arithmetic suites when there are no `dirs` either. A
task listed more than once is drawn with the sum of its entries' weights; a task of `held_out` (the
held-out evaluation pool) is never dispatched, whatever lists it. Every dispatched task is
loaded once here, so a malformed `task.toml` stops the run's start instead of failing executions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gyre.tasks.builtin import demo_task_ids
from gyre.tasks.dataset import read_dataset
from gyre.tasks.directory import DirectorySuite
from gyre.tasks.problems import Problems
from gyre.tasks.registry import TaskRegistry
from gyre.tasks.sampling import WeightedCycle
from gyre.tasks.task import TaskError, UnknownTaskError

if (
    TYPE_CHECKING
):  # the verifiers of the built-in suites import gyre.tasks: keep pydantic out of their start-up
    from gyre.config.tasks import TasksSection


@dataclass(frozen=True, slots=True)
class Query:
    task_id: str
    weight: float
    source: str
    """Where it was listed: `builtin`, `dir <path>`, `tasks.queries`, `<dataset>:<line>` (several joined by ', ')."""


@dataclass(slots=True)
class TaskSet:
    registry: TaskRegistry
    queries: list[Query]
    """What the run dispatches, weight > 0 or not, in the order listed."""
    warnings: list[str] = field(default_factory=list)
    """What the local sandbox cannot reproduce of the dispatched tasks (e.g. Dockerfile RUN steps)."""

    def cycle(self, seed: int) -> WeightedCycle:
        """The scheduler's draws; `TaskError` when nothing would be dispatched."""
        if not any(q.weight > 0 for q in self.queries):
            raise TaskError("tasks: the run would dispatch nothing (no task listed, or every weight is 0)")
        return WeightedCycle([(q.task_id, q.weight) for q in self.queries], seed)

    @classmethod
    def from_section(cls, section: TasksSection) -> TaskSet:
        """Read every directory and dataset, load every dispatched task; `TaskError` listing each defect."""
        problems = Problems()
        errors: list[str] = []
        registry = TaskRegistry()
        for root in section.dirs:
            try:
                registry.add_dir(Path(root))
            except TaskError as e:
                errors.append(str(e))
        listed: list[tuple[str, float | None, str]] = []
        for path in section.datasets:
            for entry in read_dataset(Path(path), problems):
                reference = entry.reference
                if entry.directory is not None:
                    try:
                        suite = registry.add_dir(entry.directory)
                    except TaskError as e:
                        errors.append(f"{entry.where}: {e}")
                        continue
                    reference = f"{suite.name}/{entry.directory.resolve().name}"
                listed += [
                    (tid, entry.weight, entry.where)
                    for tid in _expand(registry, reference, entry.where, errors)
                ]
        for reference in section.queries:
            listed += [
                (tid, None, "tasks.queries") for tid in _expand(registry, reference, "tasks.queries", errors)
            ]
        if not section.queries and not section.datasets:
            if registry.dir_suites:
                listed = [
                    (tid, None, f"dir {s.display}") for s in registry.dir_suites for tid in s.task_ids()
                ]
            else:
                listed = [(tid, None, "builtin") for tid in demo_task_ids()]
        held_out = set(section.held_out)
        for tid in section.held_out:
            _expand(registry, tid, "tasks.held_out", errors)
        queries = [q for q in _merge(listed, section.weights, errors) if q.task_id not in held_out]
        for query in queries:
            _load(registry, query, problems, errors)
        errors += [str(p) for p in problems.errors]
        if not errors and not section.allow_same_container_verifier:
            errors += [
                f"{tid}: [verifier] same_container = true runs the grader where the harness ran, so the "
                "harness can change what scores it; allow it for this run with "
                "tasks.allow_same_container_verifier: true"
                for tid in same_container_tasks(registry, [q.task_id for q in queries])
            ]
        if errors:
            raise TaskError("; ".join(dict.fromkeys(errors)))
        return cls(registry, queries, [str(p) for p in dict.fromkeys(problems.warnings)])

    def same_container_tasks(self) -> list[str]:
        """The dispatched tasks whose verifier runs in the execution's own container (the opt-in)."""
        return same_container_tasks(self.registry, [q.task_id for q in self.queries])


def same_container_tasks(registry: TaskRegistry, task_ids: list[str]) -> list[str]:
    return [tid for tid in dict.fromkeys(task_ids) if registry.get(tid).verifier.same_container]


def _expand(registry: TaskRegistry, reference: str, where: str, errors: list[str]) -> list[str]:
    """A task id as it is, a suite name as every task of the suite."""
    if "/" in reference:
        suite = registry.suites.get(reference.partition("/")[0])
        if suite is None:
            errors.append(
                f"{where}: {reference!r}: no suite {reference.partition('/')[0]!r} (have {sorted(registry.suites)})"
            )
            return []
        return [reference]
    suite = registry.suites.get(reference)
    if suite is None:
        errors.append(
            f"{where}: {reference!r} is neither a task id (<suite>/<name>) nor a suite (have "
            f"{sorted(registry.suites)})"
        )
        return []
    ids = suite.task_ids()
    if not ids:
        errors.append(f"{where}: the suite {reference!r} holds no tasks")
    return ids


def _merge(
    listed: list[tuple[str, float | None, str]], weights: dict[str, float], errors: list[str]
) -> list[Query]:
    merged: dict[str, tuple[float, list[str]]] = {}
    for task_id, weight, source in listed:
        if weight is None:
            weight = weights.get(task_id, weights.get(task_id.partition("/")[0], 1.0))
        total, sources = merged.get(task_id, (0.0, []))
        merged[task_id] = (total + weight, sources if source in sources else [*sources, source])
    suites = {tid.partition("/")[0] for tid in merged}
    for key in weights:
        if key not in merged and key not in suites:
            errors.append(f"tasks.weights: {key!r} names no dispatched task or suite")
    return [Query(tid, w, ", ".join(sources)) for tid, (w, sources) in merged.items()]


def _load(registry: TaskRegistry, query: Query, problems: Problems, errors: list[str]) -> None:
    """Load one dispatched task: an unknown one is named with where it was listed, a malformed one
    with its file and key."""
    suite_name, _, name = query.task_id.partition("/")
    suite = registry.suites[suite_name]
    try:
        if isinstance(suite, DirectorySuite):
            suite.load(name, problems)
        else:
            suite.get(name)
    except UnknownTaskError as e:
        errors.append(f"{query.source}: unknown task {query.task_id!r}: {e}")
    except TaskError as e:
        errors.append(str(e))
