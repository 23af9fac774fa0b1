"""Config section `tasks:`: where tasks come from and which ones a run dispatches.

One section, read alike by the scheduler (what it dispatches), the runner (workspaces, prompts) and
the evaluator (verifiers), so every service resolves a task id to the same task:

    tasks:
      dirs: [examples/tasks]                    # Harbor or task.yaml directories (a set, or one task)
      datasets: [data/train.jsonl]              # {"task": "<suite>/<id>" or a path, "weight": 2.0} per line
      queries: [tasks/fix-add, add]             # task ids and suite names to dispatch
      weights: {add: 0.5}                       # sampling weight per suite or task id
      held_out: [add/2+2, add/4+1]              # the held-out evaluation pool: never dispatched

The section holds names and paths only; `gyre.tasks.taskset.TaskSet.from_section` reads the files
(a malformed task makes the run's start fail naming the file and key; `gyre tasks check` lists every
defect). Relative paths are relative to the working directory of the services (`gyre up`'s).
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import Field, field_validator

from gyre.config.base import Section


class TasksSection(Section):
    dirs: list[Path] = Field(default_factory=list)
    """Task directories: each is one task (Harbor: instruction.md, task.toml, tests/test.sh; or Gyre's
    task.yaml) or a set of them, one per subdirectory. A set is a suite named after its directory (its
    tasks are `<dir name>/<task dir name>`); a single task belongs to the suite of its parent's name."""
    datasets: list[Path] = Field(default_factory=list)
    """JSONL files of task references, one a line: `{"task": "<suite>/<id>" or a task directory
    (relative to the file), "weight": 2.0}`; weight optional (1.0). Their tasks are dispatched."""
    queries: list[str] = Field(default_factory=list)
    """Task ids (`tasks/fix-add`, `add/3+5`) and suite names (`add`) to dispatch, besides the datasets'
    lines. With neither queries nor datasets: every task of `dirs`, or the built-in arithmetic suites
    when `dirs` is empty too."""
    weights: dict[str, float] = Field(default_factory=dict)
    """Sampling weight per task id or suite name (default 1.0; a task's own entry wins over its suite's,
    a dataset line's weight over both). A task's share of dispatched groups is its share of the total
    weight; 0 = never dispatched."""

    allow_same_container_verifier: bool = False
    """Let tasks whose task.toml sets `[verifier] same_container = true` run (Harbor's order: the verifier
    in the execution's own container, where the harness could change the grader). Off: such a task stops
    the run's start, named. The run's summary lists the tasks that used it."""

    held_out: list[str] = Field(default_factory=list)
    """Task ids (`add/2+2`) of the held-out evaluation pool: removed from what the queries and datasets
    dispatch (training never samples them) and scored by `gyre demo` on the weights of fixed steps
    (`eval_by_step` in summary.json). Empty: no held-out evaluation."""
    held_out_every_steps: int = Field(default=4, ge=1)
    """Evaluate the held-out pool on the weights published after every this many steps (and on the
    initial model, step 0, and the last step)."""
    held_out_samples: int = Field(default=4, ge=1)
    """Samples per held-out task per evaluation (temperature 1, seeded by `held_out_seed`: the same
    draws for the same weights)."""
    held_out_seed: int = 0
    """The engine seed of every held-out evaluation."""

    @field_validator("held_out")
    @classmethod
    def _held_out(cls, v: list[str]) -> list[str]:
        for tid in v:
            if "/" not in tid or any(c.isspace() for c in tid):
                raise ValueError(f"tasks.held_out lists task ids (<suite>/<name>), not suites; got {tid!r}")
        return v

    @field_validator("queries")
    @classmethod
    def _queries(cls, v: list[str]) -> list[str]:
        for q in v:
            if not q or any(c.isspace() for c in q):
                raise ValueError(f"a query is a task id or suite name without whitespace; got {q!r}")
        return v

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        for key, w in v.items():
            if not math.isfinite(w) or w < 0:
                raise ValueError(f"weight of {key!r} must be a number >= 0; got {w}")
        return v
