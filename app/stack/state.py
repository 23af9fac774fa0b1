"""`runs/<run>/stack.json`: the processes of a local-stack run, as its supervisor keeps them.

The supervisor (app/stack/supervisor.py) rewrites the file atomically whenever a process starts, exits
or restarts; `gyre status`, `gyre down` and `gyre demo` read it. A process is named by pid and psutil
start time, so a stale file never points at an unrelated process that reused a pid.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from gyre.procs import ProcessId, alive

Phase = Literal["starting", "serving", "stopping", "failed"]
MemberState = Literal["running", "restarting", "gave_up", "lost", "left", "stopped"]
"""`lost`: a satellite's cell agent out of restarts, removed from the pool while the run goes on; `left`: a
satellite's cell agent stopped after its cell left the pool with notice (a planned departure)."""


@dataclass
class ProcessEntry:
    """One process of the run (a server or a service instance)."""

    name: str
    pid: int
    grpc_port: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    log: str = ""
    started: float = 0.0
    """psutil create_time of `pid` (0: unknown, the pid alone identifies it)."""
    num_restarts: int = 0
    """Restarts since the run came up."""
    last_exit: str = ""
    """How it last exited ("killed by SIGKILL", "exited with status 1"); empty if it never did."""
    state: MemberState = "running"

    @property
    def process_id(self) -> ProcessId:
        return ProcessId(self.pid, self.started)

    def alive(self) -> bool:
        return alive(self.pid, self.started)


@dataclass
class StackState:
    """Everything `stack.json` records about a run's stack."""

    run_id: str
    run_dir: str
    config_path: str
    processes: list[ProcessEntry] = field(default_factory=list)
    supervisor_pid: int = 0
    supervisor_started: float = 0.0
    phase: Phase = "starting"
    error: str = ""
    """Why the stack failed to start or was stopped by its supervisor (a process out of restarts)."""
    stop_bound_s: float = 20.0
    """A stop brings every process down within this many seconds (`run.supervisor.stop_bound_s`)."""

    @staticmethod
    def path(run_dir: Path) -> Path:
        return run_dir / "stack.json"

    def save(self) -> None:
        """Write atomically (a reader never sees half a file)."""
        target = StackState.path(Path(self.run_dir))
        tmp = target.with_name(f".stack.json.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(target)

    @classmethod
    def load(cls, run_dir: Path) -> StackState | None:
        p = cls.path(run_dir)
        try:
            raw: dict[str, Any] = json.loads(p.read_text())
        except FileNotFoundError:
            return None
        known = {f.name for f in fields(ProcessEntry)}
        raw["processes"] = [
            ProcessEntry(**{k: v for k, v in e.items() if k in known}) for e in raw["processes"]
        ]
        return cls(**{k: v for k, v in raw.items() if k in {f.name for f in fields(cls)}})

    def supervisor_alive(self) -> bool:
        return bool(self.supervisor_pid) and alive(self.supervisor_pid, self.supervisor_started)

    def live(self) -> bool:
        """The supervisor or any recorded process still runs."""
        return self.supervisor_alive() or any(p.alive() for p in self.processes)
