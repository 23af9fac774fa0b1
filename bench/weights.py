"""Benchmark of weight transport between two cell processes: a satellite pulling the core's flat
buffer through the Mooncake Transfer Engine, against a torch.distributed (gloo) broadcast.

    gyre bench weights [--mib 256] [--repeats 5]

Two spawned processes on loopback (Mooncake over TCP, gloo over TCP). The core holds a `--mib` MiB
float32 buffer; each repeat, the satellite reads all of it (Mooncake `transfer_sync_read`, in
parallel 64 MiB chunks) or receives it (broadcast over the pair group {0, 1}, the `torch`
transport's path). Timed on the satellite from the start of its read to the last byte; medians of
`--repeats` after one warmup transfer. Bytes are checked against the core's digest once per transport.

    mooncake_pull_gib_per_s     GiB/s of one pull
    torch_broadcast_gib_per_s   GiB/s of one broadcast
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from multiprocessing.queues import Queue
from typing import Any

import torch

from gyre.trainer.collectives import CellGroups, connect_store, host_store
from gyre.trainer.flat import weights_digest
from gyre.weights.transports import TransportOptions, create_transport


def _worker(
    rank: int,
    name: str,
    numel: int,
    repeats: int,
    to_satellite: Queue[Any],
    to_core: Queue[Any],
    results: Queue[Any],
) -> None:
    torch.set_num_threads(1)
    groups = None
    if name == "torch":
        if rank == 0:
            hosted = host_store(bind_host="127.0.0.1", port=0, world_size=2, timeout_s=60)
            store = hosted.store
            to_satellite.put(hosted.port)
        else:
            store = connect_store(
                host="127.0.0.1", port=to_satellite.get(timeout=60), world_size=2, timeout_s=60
            )
        groups = CellGroups.initialize(store, cell=rank, num_cells=2, backend="gloo", timeout_s=600)
    transport = create_transport(name, TransportOptions(host="127.0.0.1", groups=groups))
    if rank == 0:
        buffer = torch.randn(numel, generator=torch.Generator().manual_seed(1))
        to_satellite.put((transport.expose(buffer), weights_digest(buffer)))
        for _ in range(repeats + 1):
            if transport.core_serves:
                transport.serve(buffer, 0, satellite=1)
        assert to_core.get(timeout=600) == "done"
    else:
        endpoint, digest = to_satellite.get(timeout=60)
        into = torch.empty(numel)
        transport.pull(endpoint, into, cell=1)  # warmup: connection set-up and first-touch of pages
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            transport.pull(endpoint, into, cell=1)
            times.append(time.perf_counter() - began)
        results.put((times, weights_digest(into) == digest))
        to_core.put("done")
    transport.close()
    if groups is not None:
        groups.close()


def _measure(name: str, numel: int, repeats: int) -> float:
    ctx = mp.get_context("spawn")
    to_satellite, to_core, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, name, numel, repeats, to_satellite, to_core, results))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    times, intact = results.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    if not intact:
        raise RuntimeError(f"the {name} transport delivered bytes that differ from the core's")
    return float(numel * 4 / statistics.median(times) / 2**30)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench weights", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mib", type=int, default=256, help="buffer size in MiB (>= 256 for the issue's figure)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    numel = args.mib * 2**20 // 4
    mooncake = _measure("mooncake", numel, args.repeats)
    broadcast = _measure("torch", numel, args.repeats)
    print(
        json.dumps(
            {
                "mooncake_pull_gib_per_s": round(mooncake, 3),
                "torch_broadcast_gib_per_s": round(broadcast, 3),
                "mooncake_vs_torch": round(mooncake / broadcast, 2),
                "buffer_mib": args.mib,
                "repeats": args.repeats,
            }
        )
    )
