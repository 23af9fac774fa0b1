"""Weight-update groups: the process group of SGLang's `/init_weights_update_group` +
`/update_weights_from_distributed`, on either side of it.

SGLang's protocol (managers/io_struct.py `InitWeightsUpdateGroupReqInput`,
`UpdateWeightsFromDistributedReqInput`): the trainer is rank 0 of a group of `world_size` processes
and hosts its rendezvous at `tcp://master_address:master_port`; each of the engine's TP ranks joins
as `rank_offset + tp_rank`. An update is one HTTP request naming the tensors (`names`, `dtypes`,
`shapes`) while rank 0 broadcasts each of them, in that order, to the group; the engine answers once
it has received and loaded them all.

The group is its own set of connections, outside torch.distributed's default world (a cell agent's
world is the cells'; an engine has none): a `TCPStore` and a backend process group made directly —
gloo between CPU processes, NCCL between GPUs. The core hosts the store on a socket it binds itself
(loopback on one machine), as `gyre.trainer.collectives.host_store` does.

    sender = UpdateGroupSender.host(bind_host="127.0.0.1", world_size=2, backend="gloo", timeout_s=60)
    ... POST /init_weights_update_group {master_address, master_port: sender.port, rank_offset: 1,
                                         group_name: "g", ...}
    sender.connect("g")                         # blocks until every engine rank has joined
    works = sender.broadcast(tensors)           # with the POST /update_weights_from_distributed in flight

    group = join_group(master_address=..., master_port=..., rank=1, world_size=2, backend="gloo",
                       timeout_s=60, host="127.0.0.1", group_name="g")   # the engine's side
    received = receive(group, [(name, dtype, shape), ...])
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

T = TypeVar("T")
BACKENDS = ("gloo", "nccl")
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of a dtype (`torch.bfloat16` → `bfloat16`), as SGLang reads it (`getattr(torch, name)`)."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    """`ValueError` naming the accepted dtypes for anything else (`torch.` prefix allowed)."""
    dtype = _DTYPES.get(str(name).removeprefix("torch."))
    if dtype is None:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(_DTYPES)}")
    return dtype


def _group(
    store: TCPStore, *, rank: int, world_size: int, backend: str, timeout_s: float, host: str, group_name: str
) -> dist.ProcessGroup:
    """Form the group under the store keys SGLang's engine ranks use: `init_custom_process_group` puts
    the rendezvous store under `PrefixStore(group_name)`, then torch's `_new_process_group_helper`
    prefixes `{group_name}/` and `{device}/` for each device's backend. The tensors travel on the
    backend of their device — `cpu/` for gloo, `cuda/` for NCCL — and that is the one formed here
    (against SGLang 0.5.23 on torch 2.13, gloo's `cuda/` half never forms on a CPU server, and rank 0
    waiting for it would wait forever; tests/integration/test_engine_backends.py publishes into it)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    device = {"gloo": "cpu", "nccl": "cuda"}.get(backend)
    if device is None:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    keys = PrefixStore(f"{device}/", PrefixStore(f"{group_name}/", PrefixStore(group_name, store)))
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        return dist.ProcessGroupGloo(keys, rank, world_size, options)
    nccl_options = dist.ProcessGroupNCCL.Options()  # untested here: no GPU on the machines that built this
    nccl_options._timeout = timeout
    return dist.ProcessGroupNCCL(keys, rank, world_size, nccl_options)


def join_group(
    *,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    backend: str,
    timeout_s: float,
    host: str,
    group_name: str,
) -> dist.ProcessGroup:
    """An engine rank's side: connect to the trainer's store and form the group (blocks until all joined).
    `host` is the address this process's gloo device binds (the interface facing the trainer)."""
    if not 0 < rank < world_size:
        raise ValueError(f"an engine rank must be in 1..{world_size - 1} (rank 0 is the trainer); got {rank}")
    store = TCPStore(
        master_address,
        master_port,
        world_size,
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return _group(
        store,
        rank=rank,
        world_size=world_size,
        backend=backend,
        timeout_s=timeout_s,
        host=host,
        group_name=group_name,
    )


def receive(
    group: dist.ProcessGroup, specs: Sequence[tuple[str, torch.dtype, tuple[int, ...]]], device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Receive the broadcast of each tensor from rank 0, in order (blocks)."""
    out: dict[str, torch.Tensor] = {}
    works = []
    for name, dtype, shape in specs:
        tensor = torch.empty(shape, dtype=dtype, device=device)
        works.append(group.broadcast(tensor, 0))
        out[name] = tensor
    for work in works:
        work.wait()
    return out


@dataclass(slots=True)
class UpdateGroupSender:
    """The trainer's side (rank 0) of one weight-update group."""

    listener: socket.socket
    store: TCPStore
    world_size: int
    backend: str
    timeout_s: float
    bind_host: str
    group: dist.ProcessGroup | None = None
    pending: list[dist.Work] = field(default_factory=list)

    @classmethod
    def host(cls, *, bind_host: str, world_size: int, backend: str, timeout_s: float) -> UpdateGroupSender:
        """Host the group's rendezvous store on `bind_host`, on a free port (`port`)."""
        if world_size < 2:
            raise ValueError(
                f"a weight-update group needs the trainer and at least one engine rank; got {world_size}"
            )
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind_host, 0))
        listener.listen(128)
        store = TCPStore(
            bind_host,
            listener.getsockname()[1],
            world_size,
            is_master=True,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=listener.fileno(),
        )
        return cls(listener, store, world_size, backend, timeout_s, bind_host)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def connect(self, group_name: str) -> None:
        """Form the group `group_name` as rank 0 (blocks until every engine rank has joined, or the
        timeout); the engines are told the same name (`/init_weights_update_group`)."""
        self.group = _group(
            self.store,
            rank=0,
            world_size=self.world_size,
            backend=self.backend,
            timeout_s=self.timeout_s,
            host=self.bind_host,
            group_name=group_name,
        )

    def broadcast(self, tensors: Sequence[torch.Tensor]) -> list[dist.Work]:
        """Start broadcasting `tensors` (contiguous, kept alive by the caller until the works complete)."""
        if self.group is None:
            raise RuntimeError("connect() the weight-update group before broadcasting")
        self.pending = [self.group.broadcast(t, 0) for t in tensors]
        return self.pending

    def close(self) -> None:
        self.group = None
        self.pending = []
        self.listener.close()


def in_daemon_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """`fn()` on a daemon thread, as an awaitable. Joining a group blocks until its peers arrive or its
    timeout ends; a daemon thread (unlike `asyncio.to_thread`'s pool) never holds up the process's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def post(result: T | None, error: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for this any more
            loop.call_soon_threadsafe(settle, result, error)

    def body() -> None:
        try:
            result = fn()
        except BaseException as e:  # handed to the awaiting coroutine
            post(None, e)
        else:
            post(result, None)

    threading.Thread(target=body, name="weight-update-group", daemon=True).start()
    return future
