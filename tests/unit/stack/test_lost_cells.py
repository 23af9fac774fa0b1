"""Out of restarts, a satellite's cell agent is lost and the run goes on; the core's agent, and any other
process, still stops the run. Both exits are published as `ProcessExited` with `gave_up`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.stack.supervisor import StackSupervisor
from gyre.config import GyreConfig


async def _exits(tmp_path: Path, name: str) -> tuple[StackSupervisor, str]:
    config = GyreConfig.model_validate(
        {
            "run": {"id": "lost", "dir": str(tmp_path / "runs"), "supervisor": {"restart": False}},
            "cell_agent": {"ports": [7001, 7002, 7003]},
        }
    )
    config.run.path.mkdir(parents=True)
    supervisor = StackSupervisor(config, tmp_path / "config.yaml", set(), wait_s=1.0)
    (member,) = [m for m in supervisor.members if m.entry.name == name]
    member.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    member.proc.wait()
    supervisor._on_exit(member, now_s=1.0)
    (event,) = [supervisor.publisher.queue.get_nowait()]
    assert event.process == name and event.gave_up and event.exit_code == 3
    return supervisor, member.entry.state


async def test_a_satellite_agent_out_of_restarts_is_lost_and_the_run_goes_on(tmp_path: Path) -> None:
    supervisor, state = await _exits(tmp_path, "cell_agent-2")
    assert state == "lost" and supervisor.gave_up == ""


async def test_the_core_agent_out_of_restarts_stops_the_run(tmp_path: Path) -> None:
    supervisor, state = await _exits(tmp_path, "cell_agent-0")
    assert (
        state == "gave_up" and "cell_agent-0 exited with status 3; restart budget spent" in supervisor.gave_up
    )


async def test_another_service_out_of_restarts_stops_the_run(tmp_path: Path) -> None:
    supervisor, state = await _exits(tmp_path, "packer")
    assert state == "gave_up" and supervisor.gave_up.startswith("packer exited with status 3")
