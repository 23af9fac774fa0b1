"""The `torch` weight transport: a torch.distributed broadcast from the core over the pair group {0, k}.

Two-sided: the core takes part in every pull (`serve`), so the cell agent queues a satellite's pull
request for the core. A header [version, numel] goes first, then the buffer; the core serves while
holding its weights lock, so the bytes are always one version. The fallback when Mooncake is not
available (`cell_agent.trainer.weight_transport: torch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from gyre.trainer.collectives import CellCollectives
from gyre.weights.transports.base import TransportError, TransportOptions, WeightTransport


class TorchBroadcastTransport(WeightTransport):
    name: ClassVar[str] = "torch"
    core_serves: ClassVar[bool] = True

    def __init__(self, groups: CellCollectives) -> None:
        self.groups = groups

    @classmethod
    def create(cls, options: TransportOptions) -> TorchBroadcastTransport:
        if options.groups is None:
            raise TransportError("the torch weight transport needs the cells' process groups")
        return cls(options.groups)

    def expose(self, buffer: torch.Tensor) -> dict[str, str]:
        return {"nbytes": str(buffer.numel() * buffer.element_size())}

    def serve(self, buffer: torch.Tensor, version: int, satellite: int) -> None:
        header = torch.tensor([version, buffer.numel()], dtype=torch.int64, device=buffer.device)
        self.groups.pair_broadcast(header, satellite)
        self.groups.pair_broadcast(buffer, satellite)

    def pull(self, endpoint: Mapping[str, str], into: torch.Tensor, *, cell: int) -> int | None:
        header = torch.zeros(2, dtype=torch.int64, device=into.device)
        self.groups.pair_broadcast(header, cell)
        version, numel = (int(x) for x in header.tolist())
        if numel != into.numel():
            raise TransportError(f"the core sends {numel} elements; this cell's buffer has {into.numel()}")
        self.groups.pair_broadcast(into, cell)
        return version

    def close(self) -> None:
        """Nothing to release: the process groups belong to the cell agent."""
