"""Cell agents as real processes for integration tests: a config file, K `python -m services.cell_agent`
processes on free loopback ports, gRPC stubs, and a packer stand-in that fills a batch's queue.

    with CellStack(tmp_path, nats_url=..., redis_url=..., run_id=..., num_cells=3) as cells:
        await cells.switch(0, TRAINING)
        ...
        cells.kill(2)                            # SIGKILL
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import yaml

from gyre.config import GyreConfig, load_config
from gyre.rl.codec import encode_microstep
from gyre.rl.microstep import MicroStep
from gyre.stack.launcher import grpc_health
from gyre.stack.servers import free_port
from gyre.store import WorkQueue
from gyre.v1 import cell_agent_pb2 as pb
from gyre.v1 import cell_agent_pb2_grpc as pb_grpc
from gyre.v1 import common_pb2

ROLLOUT = common_pb2.CELL_ROLE_ROLLOUT
TRAINING = common_pb2.CELL_ROLE_TRAINING

SMALL_MODEL = {"num_layers": 2, "d_model": 64, "num_heads": 4, "ffn_hidden": 128, "max_seq_len": 512, "seed": 3}


def cell_config(
    run_dir: Path, *, nats_url: str, redis_url: str, run_id: str, num_cells: int, overrides: dict[str, Any]
) -> GyreConfig:
    """A run config for K cells on free ports, a small model, short heartbeats (tests only)."""
    base: dict[str, Any] = {
        "run": {"id": run_id, "dir": str(run_dir)},
        "nats": {"url": nats_url},
        "redis": {"url": redis_url, "heartbeat_timeout_s": 2.0},
        "log": {"format": "json", "level": "info"},
        "model": SMALL_MODEL,
        "scheduler": {"num_cells": num_cells},
        "cell_agent": {
            "ports": [free_port() for _ in range(num_cells)],
            "engine_ports": [free_port() for _ in range(num_cells)],
            "engine": {"kv_cache_tokens": 4096, "max_batch_size": 8},
            "trainer": {"heartbeat_interval_s": 0.2, "poll_s": 0.01, "join_timeout_s": 60.0,
                        "collective_timeout_s": 60.0, "rendezvous_timeout_s": 60.0},
        },
    }

    def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    return load_config(None, environ={}, overrides=merge(base, overrides))


class CellStack:
    def __init__(
        self,
        run_dir: Path,
        *,
        nats_url: str,
        redis_url: str,
        run_id: str,
        num_cells: int,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.config = cell_config(
            run_dir, nats_url=nats_url, redis_url=redis_url, run_id=run_id, num_cells=num_cells,
            overrides=overrides or {},
        )
        self.num_cells = num_cells
        self.config_path = run_dir / "config.yaml"
        self.log_dir = run_dir / "logs"
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.channels: dict[int, grpc.aio.Channel] = {}

    def __enter__(self) -> CellStack:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False))
        repo = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1"}
        for k in range(self.num_cells):
            with open(self.log_dir / f"cell-{k}.log", "wb") as log:
                self.processes[k] = subprocess.Popen(
                    [sys.executable, "-m", "services.cell_agent", "--config", str(self.config_path), "--instance", str(k)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=repo,
                )
        deadline = time.monotonic() + 90
        waiting = set(self.processes)
        while waiting:
            for k in list(waiting):
                if self.processes[k].poll() is not None:
                    raise RuntimeError(f"cell {k} exited during start-up:\n{self.log_tail(k)}")
                if grpc_health(self.config.cell_agent.ports[k], timeout_s=0.5) == "SERVING":
                    waiting.discard(k)
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"cells {sorted(waiting)} not serving:\n{self.log_tail(min(waiting))}")
            time.sleep(0.1)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for p in self.processes.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for k, p in self.processes.items():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                if exc is None:
                    raise RuntimeError(f"cell {k} did not stop on SIGTERM:\n{self.log_tail(k)}") from None

    def log_tail(self, cell: int, lines: int = 40) -> str:
        path = self.log_dir / f"cell-{cell}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"

    def stub(self, cell: int) -> pb_grpc.CellAgentStub:
        if cell not in self.channels:
            self.channels[cell] = grpc.aio.insecure_channel(f"127.0.0.1:{self.config.cell_agent.ports[cell]}")
        return pb_grpc.CellAgentStub(self.channels[cell])

    async def close_channels(self) -> None:
        for channel in self.channels.values():
            await channel.close()
        self.channels.clear()

    async def switch(self, cell: int, role: int, weight_version: int = 0) -> pb.SwitchRoleResponse:
        return await self.stub(cell).SwitchRole(pb.SwitchRoleRequest(role=role, weight_version=weight_version))

    async def status(self, cell: int) -> pb.CellStatus:
        return await self.stub(cell).GetStatus(pb.GetCellStatusRequest())

    async def join(self, cell: int, batch_id: str, step: int, final: bool) -> pb.JoinBatchResponse:
        return await self.stub(cell).JoinBatch(
            pb.JoinBatchRequest(batch_id=batch_id, step=step, final_in_burst=final), timeout=120
        )

    def kill(self, cell: int) -> None:
        self.processes[cell].send_signal(signal.SIGKILL)
        self.processes[cell].wait()


async def enqueue(queue: WorkQueue, steps: list[MicroStep], *, close: bool) -> None:
    """The packer's side: put micro-steps (id = batch:index) and optionally close the stream."""
    for s in steps:
        await queue.put(f"{s.batch_id}:{s.index}", encode_microstep(s))
    if close:
        await queue.close()
