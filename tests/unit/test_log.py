"""Logging: structlog and every stdlib logger (uvicorn, nats-py, httpx, warnings) render as one JSON line each,
with the context bound by the handler."""

from __future__ import annotations

import io
import json
import logging
import warnings
from collections.abc import Iterator

import pytest
import structlog

from gyre.log import CHATTY_LOGGERS, bind_context, clear_context, configure_logging, get_logger

EARLY = get_logger("gyre.test.early")  # created at import, before logging is configured (as modules do)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Put the process's logging back as it was (other tests must not write into this test's buffers)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    logging.captureWarnings(False)
    structlog.reset_defaults()


def _lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_every_logger_writes_json_with_the_bound_context() -> None:
    buf = io.StringIO()
    configure_logging("json", "info", stream=buf)
    try:
        bind_context(run="r1", execution="e7", cell=2)
        EARLY.info("early_logger", n=1)
        logging.getLogger("uvicorn.error").warning(
            "Invalid HTTP request received.", extra={"color_message": "\x1b[1m"}
        )
        logging.getLogger("nats.aio.client").error("nats: encountered error", exc_info=ValueError("boom"))
        logging.getLogger("httpx").warning("HTTP Request: %s %s", "POST", "http://127.0.0.1:1/generate")
        logging.getLogger("httpx").info("HTTP Request: POST ok")  # per-request INFO is kept out at info level
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
        try:
            raise RuntimeError("crash")
        except RuntimeError:
            get_logger("gyre.test").exception("handler_failed")
    finally:
        clear_context()
    lines = _lines(buf)
    by_logger = {line["logger"]: line for line in lines}
    assert set(by_logger) == {
        "gyre.test.early",
        "uvicorn.error",
        "nats.aio.client",
        "httpx",
        "py.warnings",
        "gyre.test",
    }
    assert all(line["run"] == "r1" and line["execution"] == "e7" and line["cell"] == 2 for line in lines)
    assert all({"event", "level", "timestamp"} <= set(line) for line in lines)
    assert by_logger["uvicorn.error"]["event"] == "Invalid HTTP request received."
    assert "color_message" not in by_logger["uvicorn.error"]
    assert by_logger["nats.aio.client"]["exception"] == "ValueError: boom"
    assert by_logger["httpx"]["event"] == "HTTP Request: POST http://127.0.0.1:1/generate"
    assert "deprecated thing" in str(by_logger["py.warnings"]["event"])
    assert "RuntimeError: crash" in str(by_logger["gyre.test"]["exception"])
    assert by_logger["gyre.test.early"]["n"] == 1


def test_debug_level_lets_http_client_requests_through() -> None:
    buf = io.StringIO()
    configure_logging("json", "debug", stream=buf)
    logging.getLogger("httpx").info("HTTP Request: POST ok")
    assert [line["event"] for line in _lines(buf)] == ["HTTP Request: POST ok"]
