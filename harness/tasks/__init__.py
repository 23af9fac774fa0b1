"""Tasks: prompt, workspace template, verifier command, harness timeout, overall budget.

See `harness.tasks.task` for the format and `harness.tasks.registry` for the suites.
"""

from harness.tasks.registry import SUITES, TaskRegistry, UnknownTaskError, demo_task_ids
from harness.tasks.task import Task, TaskSuite, check_relative

__all__ = ["SUITES", "Task", "TaskRegistry", "TaskSuite", "UnknownTaskError", "check_relative", "demo_task_ids"]
