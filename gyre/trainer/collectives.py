"""The cells' torch.distributed world: one rank per cell, the K−1 prefix groups built once at start-up.

A step's gradient reduction runs over the group of the cells that took part, which is always a prefix
{0..n−1} (cells join training in index order, core first). Building a process group is a collective
of the whole world, so every group a step may need is built when all K cells are alive:

    prefix groups   {0,1}, {0,1,2}, …, {0..K−1}    reduction of a step, broadcast of new parameters
    pair groups     {0,k} for every satellite k      the `torch` weight transport's snapshot pull

Each group is its own set of connections, so a collective over {0,1} keeps working when cell 2 has
died. Rank 0 (the core) hosts the rendezvous store on the run's bind address (`run.host`); its port
is announced through Redis by the cell agent (or fixed in config). All calls block: the cell agent
runs them on a worker thread.

    hosted = host_store(bind_host="127.0.0.1", port=0, world_size=K, timeout_s=120)   # core
    store = hosted.store if k == 0 else connect_store(host=..., port=hosted.port, world_size=K, timeout_s=120)
    groups = CellGroups.initialize(store, cell=k, num_cells=K, backend="gloo", timeout_s=600)
    groups.reduce_to_core(flat_grads, num_participants=3)
    groups.broadcast_from_core(flat_params, num_participants=3)

`dist_backend: tls` carries the same three collectives over Gyre's own star of mutual-TLS connections
(`gyre.trainer.star`) for deployments whose cells' network is not private; `host_rendezvous`,
`join_rendezvous` and `initialize_groups` pick the rendezvous and the world by backend, and both worlds
offer `CellCollectives`.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch.distributed import Store, TCPStore  # type: ignore[attr-defined]

from gyre.tls import TlsFiles
from gyre.trainer.star import StarCellGroups, StarHub, StarLink


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class HostedStore:
    """The core's rendezvous store and the listening socket it serves on (keep both alive)."""

    store: TCPStore
    socket: socket.socket

    @property
    def port(self) -> int:
        return int(self.socket.getsockname()[1])

    @property
    def rendezvous(self) -> TCPStore:
        """What `initialize_groups` takes on the core: the store."""
        return self.store

    def close(self) -> None:
        self.socket.close()


def host_store(*, bind_host: str, port: int, world_size: int, timeout_s: float) -> HostedStore:
    """The core's rendezvous store on `bind_host:port` (port 0 picks a free one). TCPStore binds every
    interface unless handed a bound socket, so the socket is bound here: loopback on one machine."""
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((bind_host, port))
    listener.listen(128)
    store = TCPStore(
        bind_host or "127.0.0.1",
        listener.getsockname()[1],
        world_size,
        is_master=True,
        timeout=_timeout(timeout_s),
        wait_for_workers=False,
        master_listen_fd=listener.fileno(),
    )
    return HostedStore(store, listener)


def connect_store(*, host: str, port: int, world_size: int, timeout_s: float) -> TCPStore:
    """A satellite's client of the core's rendezvous store."""
    return TCPStore(host, port, world_size, is_master=False, timeout=_timeout(timeout_s))


def host_rendezvous(
    backend: str,
    *,
    bind_host: str,
    port: int,
    world_size: int,
    generation: int,
    timeout_s: float,
    identity: TlsFiles | None = None,
) -> HostedStore | StarHub:
    """The core's rendezvous of world `generation`: the TCPStore (gloo, NCCL) or the TLS star's hub
    (`identity`: the core's certificate, else this process's)."""
    if backend == "tls":
        return StarHub.open(
            bind_host=bind_host, port=port, generation=generation, timeout_s=timeout_s, identity=identity
        )
    return host_store(bind_host=bind_host, port=port, world_size=world_size, timeout_s=timeout_s)


def join_rendezvous(
    backend: str,
    *,
    host: str,
    port: int,
    world_size: int,
    cell: int,
    generation: int,
    timeout_s: float,
    identity: TlsFiles | None = None,
) -> TCPStore | StarLink:
    """A satellite's side of the core's rendezvous (raises RuntimeError while the core is not there yet;
    `identity`: the star's certificate of this cell, else this process's)."""
    if backend == "tls":
        return StarLink.connect(
            host=host, port=port, cell=cell, generation=generation, timeout_s=timeout_s, identity=identity
        )
    return connect_store(host=host, port=port, world_size=world_size, timeout_s=timeout_s)


def initialize_groups(
    rendezvous: Store | StarHub | StarLink, *, cell: int, num_cells: int, backend: str, timeout_s: float
) -> CellCollectives:
    """Join the world of `rendezvous` with `backend` (all K cells call this together)."""
    if backend == "tls":
        if not isinstance(rendezvous, StarHub | StarLink):
            raise TypeError(
                f"dist_backend tls forms its world over a StarHub or StarLink, not {type(rendezvous)}"
            )
        return StarCellGroups.initialize(rendezvous, cell=cell, num_cells=num_cells, timeout_s=timeout_s)
    return CellGroups.initialize(
        rendezvous, cell=cell, num_cells=num_cells, backend=backend, timeout_s=timeout_s
    )


class CellCollectives(Protocol):
    """What a step and the `torch` weight transport use of the cells' world, whatever carries it."""

    cell: int
    num_cells: int

    def reduce_to_core(self, tensor: torch.Tensor, num_participants: int) -> None: ...

    def broadcast_from_core(self, tensor: torch.Tensor, num_participants: int) -> None: ...

    def pair_broadcast(self, tensor: torch.Tensor, satellite: int) -> None: ...

    def close(self) -> None: ...


def set_socket_interface(ifname: str | None) -> None:
    """Make gloo and NCCL bind `ifname` (None leaves their default: the host name's interface)."""
    if ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
        os.environ["NCCL_SOCKET_IFNAME"] = ifname


class CellGroups:
    """The world of K cells with its pre-built groups; `cell` is this process's rank."""

    def __init__(self, cell: int, num_cells: int) -> None:
        self.cell = cell
        self.num_cells = num_cells
        self._prefix: dict[int, dist.ProcessGroup] = {}
        self._pair: dict[int, dist.ProcessGroup] = {}

    @classmethod
    def initialize(
        cls, store: Store, *, cell: int, num_cells: int, backend: str, timeout_s: float
    ) -> CellGroups:
        """Join the world and build every prefix and pair group (all K cells call this together)."""
        if not 0 <= cell < num_cells:
            raise ValueError(f"cell {cell} is outside 0..{num_cells - 1}")
        groups = cls(cell, num_cells)
        dist.init_process_group(
            backend, store=store, rank=cell, world_size=num_cells, timeout=_timeout(timeout_s)
        )
        # Same groups in the same order on every rank: new_group is a collective of the world.
        for n in range(2, num_cells + 1):
            groups._prefix[n] = dist.new_group(list(range(n)), timeout=_timeout(timeout_s))
        for k in range(1, num_cells):
            groups._pair[k] = dist.new_group([0, k], timeout=_timeout(timeout_s))
        return groups

    def _group(self, num_participants: int) -> dist.ProcessGroup | None:
        if not 1 <= num_participants <= self.num_cells:
            raise ValueError(f"a reduction needs 1..{self.num_cells} participants; got {num_participants}")
        if self.cell >= num_participants:
            raise ValueError(f"cell {self.cell} is not in the prefix 0..{num_participants - 1}")
        return None if num_participants == 1 else self._prefix[num_participants]

    def reduce_to_core(self, tensor: torch.Tensor, num_participants: int) -> None:
        """SUM `tensor` of the cells 0..n−1 into the core's copy (the others' copies are left undefined)."""
        group = self._group(num_participants)
        if group is not None:
            dist.reduce(tensor, dst=0, op=dist.ReduceOp.SUM, group=group)

    def broadcast_from_core(self, tensor: torch.Tensor, num_participants: int) -> None:
        """Copy the core's `tensor` to the cells 1..n−1."""
        group = self._group(num_participants)
        if group is not None:
            dist.broadcast(tensor, src=0, group=group)

    def pair_broadcast(self, tensor: torch.Tensor, satellite: int) -> None:
        """Copy the core's `tensor` to one satellite (called by the core and by that satellite)."""
        if self.cell not in (0, satellite) or not 1 <= satellite < self.num_cells:
            raise ValueError(f"cell {self.cell} is not in the pair (0, {satellite})")
        dist.broadcast(tensor, src=0, group=self._pair[satellite])

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
