"""The error base the process shells share: a problem found while starting, told in one line, exit 2.

`ConfigError` (a config file or override), `ModelError` (a model directory), `TaskError` (a task or task
set) and `TemplateError` (a chat template) derive from `StartupError`; a service's entry point
(`gyre.service.run_service`) and the CLI catch this one type instead of importing every part that can
refuse its input. The message is the whole report: it names the file and the field.
"""

from __future__ import annotations


class StartupError(ValueError):
    """Input a process cannot start with; the message is one line naming the file and the field."""


class ConfigError(StartupError):
    """A config file or override is invalid; the message is one line naming the field."""
