"""Structured logging (structlog): JSON when not on a TTY or when configured, console otherwise.

Handlers bind `run`, `execution`, `cell` and `step` with `bind_context(...)` at entry; every log line
of that task then carries them. Event names are snake_case.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

Format = Literal["auto", "json", "console"]


def configure_logging(format: Format = "auto", level: str = "info", stream: Any = None) -> None:
    """Configure structlog and stdlib logging once per process."""
    out = stream if stream is not None else sys.stderr
    use_json = format == "json" or (format == "auto" and not out.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    numeric = logging.getLevelName(level.upper())
    logging.basicConfig(level=numeric, stream=out, format="%(message)s", force=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None) -> Any:
    """A structlog logger; `name` becomes the `logger` field."""
    return structlog.get_logger(name) if name is None else structlog.get_logger().bind(logger=name)


def bind_context(**kv: Any) -> None:
    """Bind keys (run, execution, cell, step…) to the current task's log context."""
    structlog.contextvars.bind_contextvars(**kv)


def clear_context() -> None:
    structlog.contextvars.clear_contextvars()
