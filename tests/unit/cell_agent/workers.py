"""Process bodies for the multi-process tests (spawned: each is a fresh interpreter, like a cell)."""

from __future__ import annotations

import os
from multiprocessing.queues import Queue
from typing import Any

import torch

from gyre.trainer.collectives import CellGroups, connect_store, host_store
from gyre.trainer.flat import weights_digest
from gyre.weights.transports import TransportOptions, create_transport

_KEEP: list[Any] = []


def _groups(rank: int, world: int, ports: Queue[Any]) -> CellGroups:
    if rank == 0:
        hosted = host_store(bind_host="127.0.0.1", port=0, world_size=world, timeout_s=30)
        _KEEP.append(hosted)  # the rank-0 store and its socket must outlive the world
        store = hosted.store
        for _ in range(world - 1):
            ports.put(hosted.port)
    else:
        store = connect_store(host="127.0.0.1", port=ports.get(timeout=30), world_size=world, timeout_s=30)
        _KEEP.append(store)
    groups = CellGroups.initialize(store, cell=rank, num_cells=world, backend="gloo", timeout_s=30)
    return groups


def collectives_worker(rank: int, world: int, ports: Queue[Any], results: Queue[Any]) -> None:
    torch.set_num_threads(1)
    groups = _groups(rank, world, ports)
    grads = torch.full((5,), float(rank + 1))
    groups.reduce_to_core(grads, world)
    params = torch.full((5,), 7.0) if rank == 0 else torch.zeros(5)
    groups.broadcast_from_core(params, world)
    pair = torch.arange(3.0) if rank == 0 else torch.zeros(3)
    if rank in (0, world - 1):
        groups.pair_broadcast(pair, world - 1)
    results.put((rank, "full", grads.tolist() if rank == 0 else None, params.tolist(), pair.tolist()))
    if rank == world - 1:
        results.close()
        results.join_thread()  # flush before dying: os._exit skips the queue's feeder thread
        os._exit(0)  # this cell dies; the smaller prefix group must keep working
    grads = torch.full((5,), float(rank + 1))
    groups.reduce_to_core(grads, world - 1)
    results.put((rank, "after_death", grads.tolist() if rank == 0 else None, None, None))
    groups.close()


def transport_worker(
    rank: int, name: str, numel: int, to_satellite: Queue[Any], to_core: Queue[Any], results: Queue[Any]
) -> None:
    torch.set_num_threads(1)
    groups = _groups(rank, 2, to_satellite) if name == "torch" else None
    transport = create_transport(name, TransportOptions(host="127.0.0.1", groups=groups))
    if rank == 0:
        buffer = torch.randn(numel, generator=torch.Generator().manual_seed(7))
        to_satellite.put(transport.expose(buffer))
        if transport.core_serves:
            transport.serve(buffer, 12, satellite=1)
        results.put(("core", weights_digest(buffer), None))
        assert to_core.get(timeout=60) == "done"
    else:
        endpoint = to_satellite.get(timeout=30)
        into = torch.zeros(numel)
        version = transport.pull(endpoint, into, cell=1)
        results.put(("satellite", weights_digest(into), version))
        to_core.put("done")
    transport.close()
    if groups is not None:
        groups.close()
