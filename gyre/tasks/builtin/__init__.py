"""Built-in task suites: tasks generated from their id, needing no files on disk.

    add/3+5, parts/1+2,2+3      the arithmetic suites the demo trains on (arithmetic.py)

Adding one: subclass `TaskSuite` (gyre/tasks/task.py) with a unique `name`, `task_ids()` and
`get(name)`, and add it to `BUILTIN_SUITES`; tests/unit/tasks/test_builtin.py checks every entry (ids
round-trip through `get`, verifiers and limits are set, workspace paths stay inside the workspace).
"""

from gyre.tasks.builtin.arithmetic import AdditionSuite, MultiPartSuite
from gyre.tasks.task import TaskSuite

BUILTIN_SUITES: dict[str, type[TaskSuite]] = {
    AdditionSuite.name: AdditionSuite,
    MultiPartSuite.name: MultiPartSuite,
}


def demo_task_ids() -> list[str]:
    """Every task of the arithmetic suites: what a run dispatches when `tasks:` names nothing."""
    return AdditionSuite().task_ids() + MultiPartSuite().task_ids()


__all__ = ["BUILTIN_SUITES", "AdditionSuite", "MultiPartSuite", "demo_task_ids"]
