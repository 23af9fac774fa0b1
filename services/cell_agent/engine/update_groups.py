"""The embedded engine's side of SGLang's distributed weight updates: `/init_weights_update_group`,
`/update_weights_from_distributed`, `/destroy_weights_update_group`, over gloo.

Request fields are SGLang's (managers/io_struct.py):

    init     {master_address, master_port, rank_offset, world_size, group_name="weight_update_group",
              backend="nccl"}        → this engine (tp 1) joins as rank `rank_offset` of the trainer's group
    update   {names, dtypes, shapes, group_name, flush_cache=true, abort_all_requests=false,
              weight_version=null}   → receive each tensor's broadcast from rank 0, in order, then load
    destroy  {group_name}

The embedded engine runs on CPU, so the group's backend must be `gloo` (NCCL is refused with that
message). Receiving runs off the scheduling loop (generation goes on meanwhile); the received tensors
are then applied between two steps like any weight update (`EngineCore.update_weights`): the version
tag changes, the prefix cache is flushed (and its entries of older weights become unreachable
anyway), running requests continue unless `abort_all_requests`. Names the model does not have are
refused after the broadcast has been drained, so the trainer never hangs on a refused update and
nothing changes. Joining and receiving use daemon threads bounded by `timeout_s`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gyre.engine.update_group import in_daemon_thread, join_group, parse_dtype, receive
from services.cell_agent.engine.protocol import RequestRefused

DEFAULT_GROUP = "weight_update_group"


@dataclass(frozen=True, slots=True)
class DistributedUpdate:
    """A parsed `/update_weights_from_distributed` body."""

    group_name: str
    specs: list[tuple[str, torch.dtype, tuple[int, ...]]]
    weight_version: str | None
    flush_cache: bool
    abort_all_requests: bool


def _text(body: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or not value:
        raise RequestRefused(f"{key} must be a non-empty string; got {value!r}")
    return value


def _integer(body: Mapping[str, Any], key: str, minimum: int) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RequestRefused(f"{key} must be an integer >= {minimum}; got {value!r}")
    return value


def parse_update(body: Mapping[str, Any]) -> DistributedUpdate:
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    if not isinstance(names, list) or not isinstance(dtypes, list) or not isinstance(shapes, list):
        raise RequestRefused("names, dtypes and shapes must be lists")
    if not names or not len(names) == len(dtypes) == len(shapes):
        raise RequestRefused("names, dtypes and shapes must be non-empty lists of one entry per tensor")
    specs: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        if not isinstance(name, str) or not name:
            raise RequestRefused(f"names: {name!r} is not a parameter name")
        try:
            parsed = parse_dtype(str(dtype))
        except ValueError as e:
            raise RequestRefused(f"dtypes: {e}") from None
        if not isinstance(shape, list) or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape
        ):
            raise RequestRefused(f"shapes: {shape!r} of {name!r} is not a list of sizes")
        specs.append((name, parsed, tuple(shape)))
    version = body.get("weight_version")
    return DistributedUpdate(
        group_name=_text(body, "group_name", DEFAULT_GROUP),
        specs=specs,
        weight_version=None if version is None else str(version),
        flush_cache=bool(body.get("flush_cache", True)),
        abort_all_requests=bool(body.get("abort_all_requests", False)),
    )


class UpdateGroups:
    """The weight-update groups this engine has joined, by name."""

    def __init__(self, *, host: str, timeout_s: float) -> None:
        self.host = host
        self.timeout_s = timeout_s
        self._groups: dict[str, dist.ProcessGroup] = {}

    async def init(self, body: Mapping[str, Any]) -> str:
        """Join the group of `body` (answers once it has formed)."""
        master_address = _text(body, "master_address")
        master_port = _integer(body, "master_port", 1)
        rank = _integer(body, "rank_offset", 1)
        world_size = _integer(body, "world_size", 2)
        name = _text(body, "group_name", DEFAULT_GROUP)
        backend = body.get("backend", "nccl")
        if backend != "gloo":
            raise RequestRefused(
                f"backend {backend!r}: the embedded engine runs on CPU; its weight-update groups use gloo"
            )
        if rank >= world_size:
            raise RequestRefused(
                f"rank_offset {rank} must be below world_size {world_size} (this engine has one rank)"
            )
        if name in self._groups:
            raise RequestRefused(f"weight-update group {name!r} exists already; destroy it first")
        group = await in_daemon_thread(
            lambda: join_group(
                master_address=master_address,
                master_port=master_port,
                rank=rank,
                world_size=world_size,
                backend="gloo",
                timeout_s=self.timeout_s,
                host=self.host,
                group_name=name,
            )
        )
        self._groups[name] = group
        return f"Succeeded to initialize weight-update group {name!r} as rank {rank} of {world_size}."

    async def receive(self, update: DistributedUpdate) -> dict[str, torch.Tensor]:
        """The broadcast tensors of `update` (blocks a daemon thread, not the loop)."""
        group = self._groups.get(update.group_name)
        if group is None:
            raise RequestRefused(
                f"no weight-update group {update.group_name!r}; call /init_weights_update_group first"
            )
        return await in_daemon_thread(lambda: receive(group, update.specs))

    def drop(self, name: str) -> None:
        """Forget a group that broke (a peer died or a collective timed out: it is unusable)."""
        self._groups.pop(name, None)

    def destroy(self, body: Mapping[str, Any]) -> str:
        name = _text(body, "group_name", DEFAULT_GROUP)
        if self._groups.pop(name, None) is None:
            raise RequestRefused(f"no weight-update group {name!r}")
        return f"Succeeded to destroy weight-update group {name!r}."

    def clear(self) -> None:
        self._groups.clear()
