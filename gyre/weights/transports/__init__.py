"""Weight transports, by name (`cell_agent.trainer.weight_transport`); see `base.py` to add one."""

from __future__ import annotations

from gyre.weights.transports.base import TransportError, TransportOptions, WeightTransport
from gyre.weights.transports.mooncake import MooncakeTransport
from gyre.weights.transports.torch_dist import TorchBroadcastTransport

WEIGHT_TRANSPORTS: dict[str, type[WeightTransport]] = {
    MooncakeTransport.name: MooncakeTransport,
    TorchBroadcastTransport.name: TorchBroadcastTransport,
}


def create_transport(name: str, options: TransportOptions) -> WeightTransport:
    try:
        cls = WEIGHT_TRANSPORTS[name]
    except KeyError:
        raise ValueError(
            f"weight transport {name!r} is not registered; available: {', '.join(WEIGHT_TRANSPORTS)}"
        ) from None
    return cls.create(options)


__all__ = [
    "WEIGHT_TRANSPORTS",
    "MooncakeTransport",
    "TorchBroadcastTransport",
    "TransportError",
    "TransportOptions",
    "WeightTransport",
    "create_transport",
]
