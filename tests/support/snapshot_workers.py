"""Process bodies of the snapshot-consistency test: a core that keeps stepping its optimizer, and a
satellite that keeps pulling its snapshot through Mooncake meanwhile (spawned, one cell each)."""

from __future__ import annotations

import asyncio
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import torch

from gyre.config.training import TrainerSection
from gyre.rl.loss import ObjectiveParams
from gyre.store import Keys, connect_redis
from services.cell_agent.errors import SnapshotError
from services.cell_agent.training import TrainingSide
from tests.support.eventually import eventually
from tests.support.models import byte_dir

MODEL = byte_dir(
    1,
    128,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_size=768,
)


async def _side(cell: int, redis_url: str, run_id: str, root: Path) -> TrainingSide:
    # Mooncake: a one-sided read (the torch transport needs the core to serve each pull, which the
    # cell agent does and this bare core loop does not).
    section = TrainerSection(poll_s=0.001, rendezvous_timeout_s=60, lr=1e-3, weight_transport="mooncake")
    side = TrainingSide(
        cell=cell,
        num_cells=2,
        section=section,
        model_dir=MODEL,
        objective=ObjectiveParams(),
        redis=await connect_redis(redis_url),
        keys=Keys(run_id),
        checkpoint_root=root,
        own_host="127.0.0.1",
        core_host="127.0.0.1",
    )
    await side.start()
    await side.connect()
    if side.is_core:
        await side.expose_snapshot()
    return side


def core_worker(redis_url: str, run_id: str, root: str, versions: Queue[Any], stop: Event) -> None:
    async def main() -> None:
        torch.set_num_threads(1)
        side = await _side(0, redis_url, run_id, Path(root))
        generator = torch.Generator().manual_seed(0)
        versions.put((side.trainer.version, side.trainer.digest()))
        while not stop.is_set():
            side.trainer.flat_grads.copy_(torch.randn(side.trainer.flat_grads.shape, generator=generator))
            await side.optimizer_step()
            versions.put((side.trainer.version, side.trainer.digest()))
        await side.close()

    asyncio.run(main())


def satellite_worker(
    redis_url: str, run_id: str, root: str, pulls: Queue[Any], stop: Event, count: int
) -> None:
    async def main() -> None:
        torch.set_num_threads(1)
        side = await _side(1, redis_url, run_id, Path(root))
        got, stale, deadline = 0, 0, time.monotonic() + 60
        while got < count and time.monotonic() < deadline:
            # the core announces its first snapshot right after the world forms
            read = await eventually(side.state.read_snapshot, timeout_s=60, what="the core's first snapshot")
            try:
                ok = await side.pull_snapshot(read.record.version)
            except SnapshotError as e:
                pulls.put(("torn", str(e)))
                break
            if ok:
                got += 1
                pulls.put(("pulled", side.trainer.version, side.trainer.digest()))
            else:
                stale += 1
        pulls.put(("done", got, stale))
        stop.set()
        await side.close()

    asyncio.run(main())
