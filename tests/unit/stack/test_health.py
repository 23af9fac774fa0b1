"""The one-line "last error" a give-up message carries, read from a service's structured log."""

from __future__ import annotations

import json
from pathlib import Path

from app.stack.health import last_error


def _line(**record: object) -> str:
    return json.dumps({"timestamp": "2026-12-01T16:14:44Z", "logger": "gyre.scheduler", **record})


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "services/scheduler/executor.py", line 226, in _transition\n'
    "    drain = await self._call(\n"
    "grpc.aio._call.AioRpcError: <AioRpcError of RPC that terminated with:\n"
    "\tstatus = StatusCode.FAILED_PRECONDITION\n"
    '\tdetails = "no serving engine to move cell-1\'s calls to"\n'
    ">"
)


def test_the_last_error_line_wins_and_a_traceback_gives_its_exception_message(tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    log.write_text(
        "\n".join(
            [
                _line(event="task_crashed", task="old", error="an older error", level="error"),
                _line(event="service_serving", level="info"),
                "not json: a line printed by a library",
                _line(event="service_failed", exception=TRACEBACK, level="error"),
                _line(event="service_stopped", level="info"),
            ]
        )
    )
    error = last_error(str(log))
    assert error.startswith("service_failed: grpc.aio._call.AioRpcError:")
    assert "FAILED_PRECONDITION" in error and "no serving engine to move cell-1's calls to" in error


def test_a_task_error_is_quoted_with_its_task_and_a_log_without_errors_gives_nothing(tmp_path: Path) -> None:
    log = tmp_path / "proxy.log"
    log.write_text(_line(event="task_crashed", task="proxy/sync", error="boom", level="error") + "\n")
    assert last_error(str(log)) == "task_crashed proxy/sync: boom"
    log.write_text(_line(event="service_serving", level="info") + "\n")
    assert last_error(str(log)) == ""
    assert last_error(str(tmp_path / "missing.log")) == ""
