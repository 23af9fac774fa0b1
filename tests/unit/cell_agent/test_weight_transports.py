"""Every registered weight transport moves a buffer from the core to a satellite bit for bit (two
spawned processes; Mooncake over TCP on loopback, torch over a gloo pair group)."""

from __future__ import annotations

import multiprocessing as mp
from typing import get_args

import pytest

from gyre.config.training import WeightTransportName
from gyre.weights.transports import (
    WEIGHT_TRANSPORTS,
    TransportError,
    TransportOptions,
    create_transport,
    transport_class,
)
from gyre.weights.transports.mooncake import CHUNK_BYTES
from tests.unit.cell_agent.workers import transport_worker


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "numel"),
    [(n, 4099) for n in sorted(WEIGHT_TRANSPORTS)] + [("mooncake", CHUNK_BYTES // 4 + 1000)],
)
def test_pull_is_bit_identical(name: str, numel: int) -> None:
    ctx = mp.get_context("spawn")
    to_satellite, to_core, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=transport_worker, args=(r, name, numel, to_satellite, to_core, results))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    got = {who: (digest, version) for who, digest, version in (results.get(timeout=90) for _ in range(2))}
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert got["satellite"][0] == got["core"][0]
    assert got["satellite"][1] == (12 if transport_class(name).core_serves else None)


def test_torch_transport_needs_groups() -> None:
    with pytest.raises(TransportError, match="process groups"):
        create_transport("torch", TransportOptions())


def test_unknown_transport() -> None:
    with pytest.raises(ValueError, match="available: mooncake, torch"):
        create_transport("nixl", TransportOptions())


def test_the_config_names_exactly_the_registered_transports() -> None:
    assert set(get_args(WeightTransportName)) == set(WEIGHT_TRANSPORTS)
