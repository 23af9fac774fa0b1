"""Structured logging (structlog over stdlib logging): every line of a process in one format.

    configure_logging("json", "info")      # once, at process start (run_service does it for services)
    log = get_logger("gyre.runner")
    bind_context(run="r1", execution="e7")  # every line of this task carries them from here on
    log.info("execution_started", pid=42)

JSON when not on a TTY or when configured, console otherwise. Gyre's own structlog loggers and every stdlib
logger — uvicorn, grpc, nats-py, httpx, asyncio, warnings — go through one handler on the root logger whose
`ProcessorFormatter` renders them alike: `event`, `level`, `logger`, `timestamp`, and the context bound with
`bind_context` (run, execution, cell, step…), so a line from httpx inside a handler carries the handler's
execution. Event names are snake_case. Per-request INFO lines of HTTP clients (httpx, httpcore) are kept at
WARNING unless the level is `debug`: the proxy makes one engine call per harness call.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

Format = Literal["auto", "json", "console"]

CHATTY_LOGGERS: tuple[str, ...] = ("httpx", "httpcore")
"""Loggers that log every request at INFO; raised to WARNING unless the level is debug."""


def _shared_processors() -> list[Any]:
    """What every line gets, whether it comes from structlog or from a stdlib logger."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


def _drop_noise(logger: Any, name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """stdlib records already interpolated their arguments into `event`, and uvicorn's `color_message` repeats
    the message with terminal colours."""
    event.pop("positional_args", None)
    event.pop("color_message", None)
    return event


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is when a line is emitted (a test runner swaps it per test)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure_logging(format: Format = "auto", level: str = "info", stream: Any = None) -> None:
    """Configure structlog and stdlib logging for the whole process (call again to reconfigure). Lines go
    to `stream`, by default standard error: standard output belongs to a command's own output."""
    out = stream if stream is not None else sys.stderr
    use_json = format == "json" or (format == "auto" and not out.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    numeric = logging.getLevelName(level.upper())
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_shared_processors(), structlog.stdlib.ExtraAdder(), _drop_noise],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(out) if stream is not None else _StderrHandler()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(
            logging.DEBUG if numeric <= logging.DEBUG else max(numeric, logging.WARNING)
        )
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # uvicorn's own handlers, if it set any
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    logging.captureWarnings(False)  # and again: a catch_warnings block may have undone an earlier capture
    logging.captureWarnings(True)
    structlog.configure(
        processors=[
            *_shared_processors(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None) -> Any:
    """A structlog logger over the stdlib logger `name` (the `logger` field once `configure_logging` ran). It
    is lazy: a module-level logger created at import renders with whatever `configure_logging` set up later."""
    return structlog.get_logger(name) if name is not None else structlog.get_logger()


def bind_context(**kv: Any) -> None:
    """Bind keys (run, execution, cell, step…) to the current task's log context."""
    structlog.contextvars.bind_contextvars(**kv)


def clear_context() -> None:
    structlog.contextvars.clear_contextvars()
