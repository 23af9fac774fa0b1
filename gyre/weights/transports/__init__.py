"""Weight transports, by name (`cell_agent.trainer.weight_transport`); see `base.py` to add one.

    transport = create_transport("torch", options)

The registry maps a name to a loader of its class, so a transport's imports (torch, Mooncake) happen
only when a cell builds it; `cell_agent.trainer.weight_transport` names one (`gyre.config.training.
WeightTransportName`, kept equal to these names by the contract test);
tests/unit/cell_agent/test_weight_transports.py runs every name here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gyre.lazy import lazy_exports

if TYPE_CHECKING:
    from gyre.weights.transports.base import TransportOptions, WeightTransport


def _mooncake() -> type[WeightTransport]:
    from gyre.weights.transports.mooncake import MooncakeTransport

    return MooncakeTransport


def _torch() -> type[WeightTransport]:
    from gyre.weights.transports.torch_dist import TorchBroadcastTransport

    return TorchBroadcastTransport


WEIGHT_TRANSPORTS: dict[str, Callable[[], type[WeightTransport]]] = {"mooncake": _mooncake, "torch": _torch}
"""name → a function returning the transport class (importing its module on first use)."""


def transport_class(name: str) -> type[WeightTransport]:
    try:
        load = WEIGHT_TRANSPORTS[name]
    except KeyError:
        raise ValueError(
            f"weight transport {name!r} is not registered; available: {', '.join(WEIGHT_TRANSPORTS)}"
        ) from None
    return load()


def create_transport(name: str, options: TransportOptions) -> WeightTransport:
    return transport_class(name).create(options)


__getattr__ = lazy_exports(
    __name__,
    {
        "MooncakeTransport": "gyre.weights.transports.mooncake",
        "TorchBroadcastTransport": "gyre.weights.transports.torch_dist",
        "TransportError": "gyre.weights.transports.base",
        "TransportOptions": "gyre.weights.transports.base",
        "WeightTransport": "gyre.weights.transports.base",
    },
)
"""The package's classes, imported on first use (importing the registry stays free of torch)."""
