"""Bring a run back up after every process of it died at once (`gyre resume RUN`).

    state = resume_stack(Path("runs/demo-20261201-130000"), wait_s=120)

A run's durable state is all under its directory: the resolved `config.yaml` (ports, credentials), NATS
JetStream's file store (`nats/`: the event stream the scheduler resumes from at its next sequence), Redis'
append-only file (`redis/`: the scheduler's persisted policy state, the trees, records and micro-steps)
and the core's checkpoints (`checkpoints/`, every `cell_agent.trainer.checkpoint_every_steps`). Resuming
starts the same supervisor on the same config — the same ports, credentials and data directories — so
each service restarts as after its own crash: the scheduler from its persisted state, the core from its
newest checkpoint (replaying the steps after it from their stored micro-steps), the runner and evaluator
from their queues. Leftovers of the dead run (a process that survived) are stopped first; a run whose
supervisor still lives is refused.
"""

from __future__ import annotations

import threading
from pathlib import Path

from app.stack.launcher import StackError, launch_supervisor
from app.stack.state import StackState
from gyre.config import load_config
from gyre.procs import stop_processes

_SERVERS = ("nats", "redis")


def _servers(run_dir: Path, previous: StackState | None) -> list[str]:
    """The servers the dead run's stack had started itself (the rest were given as URLs)."""
    if previous is not None:
        return [p.name for p in previous.processes if p.name in _SERVERS]
    return [name for name in _SERVERS if (run_dir / name).is_dir()]


def resume_stack(
    run_dir: Path, wait_s: float = 120.0, attached: bool = True, stop: threading.Event | None = None
) -> StackState:
    """Start the supervisor of the run under `run_dir` again on its resolved config; wait until SERVING."""
    run_dir = run_dir.resolve()
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise StackError(f"{run_dir} has no config.yaml: not a run directory (give `runs/<run id>`)")
    config = load_config(config_path)
    previous = StackState.load(run_dir)
    if previous is not None and previous.supervisor_alive():
        raise StackError(f"run {config.run.id!r} is still up (see `gyre status`); nothing to resume")
    if previous is not None:  # adopt and stop what survived the crash, servers last
        left = [p for p in previous.processes if p.alive()]
        stop_processes([p.process_id for p in left if p.name not in _SERVERS], grace_s=5.0)
        stop_processes([p.process_id for p in left if p.name in _SERVERS], grace_s=3.0)
    servers = _servers(run_dir, previous)
    StackState.path(run_dir).unlink(missing_ok=True)
    return launch_supervisor(config, config_path, run_dir, servers, wait_s, attached=attached, stop=stop)
