"""Benchmark of weight transport between two cell processes: a satellite pulling the core's flat
buffer through the Mooncake Transfer Engine, against a torch.distributed (gloo) broadcast.

    gyre bench weights [--mib 256] [--repeats 5]
    gyre bench weights --lora [--model DIR] [--rank 16] [--target-modules all-linear] [--transport torch]

Two spawned processes on loopback (Mooncake over TCP, gloo over TCP, the TLS star). The core holds a
`--mib` MiB float32 buffer; each repeat, the satellite reads all of it (Mooncake `transfer_sync_read`, in
parallel 64 MiB chunks) or receives it (broadcast over the pair group {0, 1}, the `torch`
transport's path, over gloo or over `dist_backend: tls`'s star with certificates from `gyre tls init`'s
issuer). Timed on the satellite from the start of its read to the last byte; medians of `--repeats` after
one warmup transfer. Bytes are checked against the core's digest once per transport.

    mooncake_pull_gib_per_s        GiB/s of one pull
    torch_broadcast_gib_per_s      GiB/s of one broadcast over gloo (plaintext)
    tls_star_broadcast_gib_per_s   GiB/s of one broadcast over the TLS star (`tls_star_vs_gloo`: the ratio)

`--lora` measures instead what a LoRA run saves: bytes and seconds of a publication and of a satellite's
pull, the adapter against the full weights of the same model, in one run (`bench/_weights_lora.py`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import torch

from bench._startup import run_bench
from gyre import tls
from gyre.trainer.collectives import host_rendezvous, initialize_groups, join_rendezvous
from gyre.trainer.flat import weights_digest
from gyre.weights.transports import TransportOptions, create_transport


def _worker(
    rank: int,
    name: str,
    numels: list[int],
    repeats: int,
    to_satellite: Queue[Any],
    to_core: Queue[Any],
    results: Queue[Any],
    certs: str | None = None,
) -> None:
    """One side of a pair: the core exposes (or serves) a buffer of each size in `numels` in turn, the
    satellite pulls it `repeats` + 1 times (the first a warmup) and reports its times. With `certs` (a
    `gyre tls init` directory), the `torch` transport runs over the TLS star instead of gloo."""
    torch.set_num_threads(1)
    groups: Any = None
    hosted: Any = None  # the core's rendezvous must outlive the world
    if name == "torch":
        backend = "gloo" if certs is None else "tls"
        if certs is not None:
            tls.configure(tls.TlsFiles.under(Path(certs), tls.cell_directory(rank)))  # each cell its own
        if rank == 0:
            hosted = host_rendezvous(
                backend, bind_host="127.0.0.1", port=0, world_size=2, generation=1, timeout_s=60
            )
            to_satellite.put(hosted.port)
            rendezvous = hosted.rendezvous
        else:
            rendezvous = join_rendezvous(
                backend,
                host="127.0.0.1",
                port=to_satellite.get(timeout=60),
                world_size=2,
                cell=1,
                generation=1,
                timeout_s=60,
            )
        groups = initialize_groups(rendezvous, cell=rank, num_cells=2, backend=backend, timeout_s=600)
    transport = create_transport(name, TransportOptions(host="127.0.0.1", groups=groups))
    for numel in numels:
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
    if hosted is not None:
        hosted.close()


def _pull_seconds(name: str, numels: list[int], repeats: int, certs: str | None = None) -> list[float]:
    """Median seconds of one pull of each buffer of `numels` float32 through transport `name`, between
    one pair of processes (one warmup pull per buffer); `certs`: over the TLS star (`_worker`)."""
    ctx = mp.get_context("spawn")
    to_satellite, to_core, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, name, numels, repeats, to_satellite, to_core, results, certs))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    measured = [results.get(timeout=600) for _ in numels]
    for p in procs:
        p.join(timeout=60)
    if not all(intact for _, intact in measured):
        raise RuntimeError(f"the {name} transport delivered bytes that differ from the core's")
    return [float(statistics.median(times)) for times, _ in measured]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench weights", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mib", type=int, default=256, help="buffer size in MiB (>= 256 for the issue's figure)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lora", action="store_true", help="adapter against full weights (module docstring)")
    parser.add_argument(
        "--model", type=Path, default=None, help="--lora: HF model directory (default: a small Qwen3)"
    )
    parser.add_argument("--rank", type=int, default=16, help="--lora: the adapter's rank")
    parser.add_argument("--target-modules", nargs="+", default=["all-linear"], help="--lora: adapted modules")
    parser.add_argument(
        "--transport", choices=["torch", "mooncake"], default="torch", help="--lora: pull transport"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.lora:
        from bench._weights_lora import compare

        run_bench(
            "weights",
            lambda work: compare(
                args.model, args.rank, args.target_modules, args.transport, args.repeats, work, _pull_seconds
            ),
        )
        return
    numel = args.mib * 2**20 // 4
    mooncake = numel * 4 / _pull_seconds("mooncake", [numel], args.repeats)[0] / 2**30
    broadcast = numel * 4 / _pull_seconds("torch", [numel], args.repeats)[0] / 2**30
    with tempfile.TemporaryDirectory(prefix="gyre-bench-tls-") as certs:
        tls.issue(Path(certs), {tls.cell_directory(0): [], tls.cell_directory(1): []})
        star = numel * 4 / _pull_seconds("torch", [numel], args.repeats, certs)[0] / 2**30
    print(
        json.dumps(
            {
                "mooncake_pull_gib_per_s": round(mooncake, 3),
                "torch_broadcast_gib_per_s": round(broadcast, 3),
                "tls_star_broadcast_gib_per_s": round(star, 3),
                "mooncake_vs_torch": round(mooncake / broadcast, 2),
                "tls_star_vs_gloo": round(star / broadcast, 2),
                "buffer_mib": args.mib,
                "repeats": args.repeats,
            }
        )
    )
