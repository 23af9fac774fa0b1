"""The extension point for moving the core's flat parameter buffer to a satellite.

Two shapes of transport exist. One-sided (`mooncake`): the core exposes its buffer once and
satellites read it without the core doing anything per pull. Two-sided (`torch`): the core takes part
in every pull (`core_serves = True`), so the cell agent queues pull requests for the core to serve.

    transport = create_transport("mooncake", TransportOptions(host="10.0.0.1"))
    endpoint = transport.expose(flat_params)                  # core, once per buffer address
    transport.pull(endpoint, into=my_flat_params)             # satellite

To add one: subclass `WeightTransport`, set `name` and `core_serves`, implement the methods, add it to
`WEIGHT_TRANSPORTS` in `transports/__init__.py`; `cell_agent.trainer.weight_transport` selects it and
tests/unit/cell_agent/test_weight_transports.py runs every registered transport.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from gyre.trainer.collectives import CellCollectives


class TransportError(RuntimeError):
    """A pull or an expose failed (peer unreachable, buffer not registered, size mismatch)."""


@dataclass(frozen=True, slots=True)
class TransportOptions:
    host: str = "127.0.0.1"
    """Address this process announces for one-sided reads of its buffers."""
    protocol: str = "tcp"
    """Mooncake: `tcp` or `rdma`."""
    device: str = ""
    """Mooncake: RDMA device names (empty for TCP or auto-discovery)."""
    groups: CellCollectives | None = None
    """torch: the cells' process groups (the pair group {0, k} carries a pull)."""


class WeightTransport(ABC):
    name: ClassVar[str]
    core_serves: ClassVar[bool]
    """True when the core must take part in each pull (`serve`)."""

    @classmethod
    @abstractmethod
    def create(cls, options: TransportOptions) -> WeightTransport: ...

    @abstractmethod
    def expose(self, buffer: torch.Tensor) -> dict[str, str]:
        """Core: make `buffer` readable; returns the endpoint fields satellites pull with."""

    def serve(self, buffer: torch.Tensor, version: int, satellite: int) -> None:
        """Core side of one pull by `satellite` (two-sided transports only)."""
        raise NotImplementedError(f"the {self.name} transport is one-sided: the core serves no pulls")

    @abstractmethod
    def pull(self, endpoint: Mapping[str, str], into: torch.Tensor, *, cell: int) -> int | None:
        """Satellite `cell`: copy the exposed buffer into `into` (same size); returns the version when
        the transport carries it (two-sided), else None (the caller checks the snapshot record)."""

    @abstractmethod
    def close(self) -> None: ...
