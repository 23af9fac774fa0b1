"""Health of the stack's processes: grpc.health.v1 checks on loopback, and the tail of a process's log."""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.stack.servers import LOOPBACK
from gyre.rpc import aio_channel, sync_channel


def grpc_health(port: int, timeout_s: float = 1.0) -> str:
    """SERVING / NOT_SERVING / UNKNOWN / UNREACHABLE for a gRPC server on loopback."""
    with sync_channel(f"{LOOPBACK}:{port}") as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.RpcError:
            return "UNREACHABLE"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


async def grpc_health_async(port: int, timeout_s: float = 1.0) -> int:
    """The serving status (`HealthCheckResponse.ServingStatus`) of a gRPC server on loopback; UNKNOWN when
    it does not answer."""
    async with aio_channel(f"{LOOPBACK}:{port}") as channel:
        try:
            resp = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.RpcError:
            return int(health_pb2.HealthCheckResponse.UNKNOWN)
    return int(resp.status)


def tail(path: str, lines: int = 15) -> str:
    """The last `lines` lines of a log file (or "(no log)")."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def last_error(path: str) -> str:
    """The last error a service logged (its structured `level: error` line: event, task, error), in one line;
    "" when its log has none. What a user needs first when a process exits again and again."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()[-400:]
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or record.get("level") not in ("error", "critical"):
            continue
        what = " ".join(str(record[k]) for k in ("event", "task") if record.get(k))
        detail = str(record.get("error") or _exception_message(str(record.get("exception", ""))))
        detail = " ".join(detail.split())
        return f"{what}: {detail[:400]}" if detail else what
    return ""


def _exception_message(traceback: str) -> str:
    """`Type: message` and what follows it, from the end of a formatted traceback."""
    lines = traceback.splitlines()
    starts = [i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line)]
    return "\n".join(lines[starts[-1] :]) if starts else (lines[-1] if lines else "")


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
