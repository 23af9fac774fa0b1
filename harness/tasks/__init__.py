"""The demo harness's tasks are the task library's built-in arithmetic suites (gyre/tasks/builtin/).
This name remains only for harness/warmstart.py and its test; new code imports gyre.tasks."""

from gyre.tasks import TaskRegistry, demo_task_ids

__all__ = ["TaskRegistry", "demo_task_ids"]
