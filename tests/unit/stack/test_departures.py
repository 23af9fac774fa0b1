"""A satellite that left the pool with notice: once the scheduler shows its cell GONE, the supervisor stops
its cell agent as a planned departure — state `left`, no restart, no `ProcessExited`, the run goes on. The
core's agent, and a lost one, are not touched."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from app.stack import supervisor as supervisor_module
from app.stack.departures import satellite_cell
from app.stack.supervisor import Member, StackSupervisor
from gyre.config import GyreConfig
from tests.support.eventually import eventually


def test_satellite_cells_are_named_by_their_agents() -> None:
    assert satellite_cell("cell_agent-2") == 2
    assert satellite_cell("cell_agent-0") is None  # the core
    assert satellite_cell("cell_agent-x") is None
    assert satellite_cell("proxy") is None


def _supervisor(tmp_path: Path) -> StackSupervisor:
    config = GyreConfig.model_validate(
        {"run": {"id": "left", "dir": str(tmp_path / "runs")}, "cell_agent": {"ports": [7001, 7002, 7003]}}
    )
    config.run.path.mkdir(parents=True)
    return StackSupervisor(config, tmp_path / "config.yaml", set(), wait_s=1.0)


def _running(supervisor: StackSupervisor, name: str) -> Member:
    (member,) = [m for m in supervisor.members if m.entry.name == name]
    idle = "import time; time.sleep(600)"  # scenario: an agent that idles until it is stopped
    member.proc = subprocess.Popen([sys.executable, "-c", idle])
    member.entry.pid = member.proc.pid
    return member


async def test_the_agent_of_a_cell_gone_from_the_pool_is_stopped_as_planned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor = _supervisor(tmp_path)
    leaving, core = _running(supervisor, "cell_agent-2"), _running(supervisor, "cell_agent-0")
    (lost,) = [m for m in supervisor.members if m.entry.name == "cell_agent-1"]
    lost.entry.state = "lost"
    asked: list[int] = []

    async def gone_cells(port: int, timeout_s: float = 2.0) -> set[int]:
        asked.append(port)
        return {0, 1, 2}  # the core's GONE stands for a scheduler's mistake: never acted on

    monkeypatch.setattr(supervisor_module, "gone_cells", gone_cells)
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)
    watch = asyncio.create_task(supervisor._watch_departures())
    try:
        await eventually(lambda: leaving.entry.state == "left" and leaving.entry.last_exit, timeout_s=20)
    finally:
        watch.cancel()
    assert leaving.proc is not None and leaving.proc.poll() is not None
    assert (
        leaving.entry.last_exit == "stopped by SIGTERM (planned departure)"
        and leaving.entry.num_restarts == 0
    )
    assert asked[0] == supervisor.config.scheduler.port
    assert core.proc is not None and core.proc.poll() is None and core.entry.state == "running"
    assert lost.entry.state == "lost"
    assert supervisor.publisher.queue.empty() and supervisor.gave_up == ""
    core.proc.kill()
    core.proc.wait()
