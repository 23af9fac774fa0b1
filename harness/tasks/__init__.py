"""The demo harness's tasks are the task library's built-in arithmetic suites (gyre/tasks/builtin/);
this name stays for harness modules that still import it from here."""

from gyre.tasks import Task, TaskRegistry, demo_task_ids

__all__ = ["Task", "TaskRegistry", "demo_task_ids"]
