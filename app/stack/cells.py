"""K cell agents as local processes on loopback, for benchmarks and integration tests.

    config = with_cell_ports(load_config(...), num_cells=2)
    with LocalCells(config, run_dir) as cells:          # spawns `python -m services.cell_agent` × K
        await cells.switch(0, CELL_ROLE_TRAINING)
        await cells.join(0, "b0", step=0, final=True)
        cells.kill(1)                                    # SIGKILL, for failure tests

`gyre up` starts the whole stack; this starts only the cells (NATS and Redis must be given).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import grpc
import yaml

from app.stack.health import grpc_health
from app.stack.servers import free_port
from gyre.config import GyreConfig
from gyre.paths import REPO_ROOT
from gyre.rpc import aio_channel
from gyre.v1 import cell_agent_pb2 as pb
from gyre.v1 import cell_agent_pb2_grpc as pb_grpc
from gyre.v1 import common_pb2


def with_cell_ports(config: GyreConfig, num_cells: int) -> GyreConfig:
    """A copy of `config` for `num_cells` cells with free gRPC and engine ports on loopback."""
    c = config.model_copy(deep=True)
    c.scheduler.num_cells = num_cells
    c.cell_agent.ports = [free_port() for _ in range(num_cells)]
    c.cell_agent.engine_ports = [free_port() for _ in range(num_cells)]
    return c


class LocalCells:
    def __init__(self, config: GyreConfig, run_dir: Path, *, start_timeout_s: float = 90.0) -> None:
        if len(config.cell_agent.ports) != config.scheduler.num_cells:
            raise ValueError("give every cell a gRPC port (with_cell_ports does)")
        self.config = config
        self.num_cells = config.scheduler.num_cells
        self.config_path = run_dir / "config.yaml"
        self.log_dir = run_dir / "logs"
        self.start_timeout_s = start_timeout_s
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._channels: dict[int, grpc.aio.Channel] = {}

    def __enter__(self) -> LocalCells:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False))
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        try:
            for k in range(self.num_cells):
                with open(self.log_dir / f"cell-{k}.log", "wb") as log:
                    self.processes[k] = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "services.cell_agent",
                            "--config",
                            str(self.config_path),
                            "--instance",
                            str(k),
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=env,
                        cwd=REPO_ROOT,
                    )
            self._wait_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        waiting = set(self.processes)
        while waiting:
            for k in sorted(waiting):
                if self.processes[k].poll() is not None:
                    raise RuntimeError(f"cell {k} exited during start-up:\n{self.log_tail(k)}")
                if grpc_health(self.config.cell_agent.ports[k], timeout_s=0.5) == "SERVING":
                    waiting.discard(k)
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"cells {sorted(waiting)} not serving:\n{self.log_tail(min(waiting))}")
            time.sleep(0.1)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(raise_on_hang=exc is None)

    def stop(self, grace_s: float = 20.0, *, raise_on_hang: bool = False) -> None:
        """SIGTERM every cell, wait, SIGKILL what is left (and raise if asked to)."""
        for p in self.processes.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        hung = []
        for k, p in self.processes.items():
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                hung.append(k)
        if hung and raise_on_hang:
            raise RuntimeError(f"cells {hung} did not stop on SIGTERM:\n{self.log_tail(hung[0])}")

    def log_tail(self, cell: int, lines: int = 40) -> str:
        path = self.log_dir / f"cell-{cell}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"
        )

    def stub(self, cell: int) -> pb_grpc.CellAgentStub:
        if cell not in self._channels:
            self._channels[cell] = aio_channel(f"127.0.0.1:{self.config.cell_agent.ports[cell]}")
        return pb_grpc.CellAgentStub(self._channels[cell])

    async def close_channels(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def switch(
        self, cell: int, role: common_pb2.CellRole.ValueType, weight_version: int = 0
    ) -> pb.SwitchRoleResponse:
        request = pb.SwitchRoleRequest(role=role, weight_version=weight_version)
        response: pb.SwitchRoleResponse = await self.stub(cell).SwitchRole(request)
        return response

    async def status(self, cell: int) -> pb.CellStatus:
        status: pb.CellStatus = await self.stub(cell).GetStatus(pb.GetCellStatusRequest())
        return status

    async def join(
        self, cell: int, batch_id: str, step: int, final: bool, timeout_s: float = 300
    ) -> pb.JoinBatchResponse:
        response: pb.JoinBatchResponse = await self.stub(cell).JoinBatch(
            pb.JoinBatchRequest(batch_id=batch_id, step=step, final_in_burst=final), timeout=timeout_s
        )
        return response

    def kill(self, cell: int) -> None:
        self.processes[cell].send_signal(signal.SIGKILL)
        self.processes[cell].wait()
