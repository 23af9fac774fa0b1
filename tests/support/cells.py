"""Cell agents as real processes for integration tests: a small-model test config on free ports, the
local launcher of `app.stack.cells`, and a packer stand-in that fills a batch's queue.

    with CellStack(tmp_path, nats_url=..., redis_url=..., run_id=..., num_cells=3) as cells:
        await cells.switch(0, TRAINING)
        ...
        cells.kill(2)                            # SIGKILL
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.stack.cells import LocalCells, with_cell_ports
from gyre.config import GyreConfig, load_config
from gyre.rl.codec import encode_microstep
from gyre.rl.microstep import MicroStep
from gyre.store import WorkQueue
from gyre.v1 import common_pb2
from tests.support.models import cell_dir

ROLLOUT = common_pb2.CELL_ROLE_ROLLOUT
TRAINING = common_pb2.CELL_ROLE_TRAINING

SMALL_MODEL = {"path": str(cell_dir())}
"""A 2-layer Llama with grouped-query attention in the demo model's format (tests/support/models.py)."""


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


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
        "cell_agent": {
            "engine": {"kv_cache_tokens": 4096, "max_batch_size": 8},
            "trainer": {
                "heartbeat_interval_s": 0.2,
                "poll_s": 0.01,
                "join_timeout_s": 60.0,
                "collective_timeout_s": 60.0,
                "rendezvous_timeout_s": 60.0,
            },
        },
    }
    return with_cell_ports(load_config(None, environ={}, overrides=_merge(base, overrides)), num_cells)


class CellStack(LocalCells):
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
        config = cell_config(
            run_dir,
            nats_url=nats_url,
            redis_url=redis_url,
            run_id=run_id,
            num_cells=num_cells,
            overrides=overrides or {},
        )
        super().__init__(config, run_dir)


async def enqueue(queue: WorkQueue, steps: list[MicroStep], *, close: bool) -> None:
    """The packer's side: put micro-steps (id = batch:index) and optionally close the stream."""
    for s in steps:
        await queue.put(f"{s.batch_id}:{s.index}", encode_microstep(s))
    if close:
        await queue.close()
