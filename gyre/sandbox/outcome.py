"""How a sandboxed command ended, read from the supervisor's status file (`control/status.json`,
written by `init.py`), with a one-line description for termination events."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class SandboxOutcome:
    """How the command ended (read from the supervisor's status file)."""

    exit_code: int | None
    signal: int | None
    started: bool
    """False when the command never ran (sandbox setup or exec failed)."""
    error: str = ""
    cpu_s: float = 0.0
    """CPU seconds of the command (and the children it waited for)."""
    sandbox_cpu_s: float = 0.0
    """CPU seconds of the whole sandbox: the supervisor and its namespace child too."""
    maxrss_kb: int = 0
    stderr_tail: str = ""
    memory_killed: bool = False
    """The kernel killed a process of the sandbox for its memory limit (a container's cgroup)."""

    def describe(self) -> str:
        """One line for `ExecutionTerminated.detail`."""
        if not self.started:
            return f"sandbox never started: {self.error}"
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = str(self.signal)
            hints = {int(signal.SIGXCPU): " (cpu limit)", int(signal.SIGXFSZ): " (file size limit)"}
            if self.memory_killed:
                hints[int(signal.SIGKILL)] = " (memory limit)"
            text = f"killed by {name}{hints.get(self.signal, '')}"
        elif self.exit_code is None:
            text = self.error or "ended without a status"
        else:
            text = f"exit {self.exit_code}"
        return f"{text}: {self.stderr_tail}" if self.stderr_tail else text


def _tail(path: Path, max_bytes: int = 4096) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - max_bytes))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def read_outcome(control_dir: Path) -> SandboxOutcome | None:
    """The outcome recorded in `control_dir`, or None if the supervisor wrote none (yet)."""
    try:
        status: dict[str, Any] = json.loads((control_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None
    error = status.get("setup_error") or status.get("exec_error") or ""
    return SandboxOutcome(
        exit_code=status.get("exit_code"),
        signal=status.get("signal"),
        started=not error,
        error=error,
        cpu_s=float(status.get("cpu_s") or 0.0),
        sandbox_cpu_s=float(status.get("sandbox_cpu_s") or 0.0),
        maxrss_kb=int(status.get("maxrss_kb") or 0),
        stderr_tail=_tail(control_dir / "stderr.log"),
    )
