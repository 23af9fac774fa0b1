"""`hold_grpc_aio`: gRPC AsyncIO's poller outlives the last channel of a loop, so freeing it never runs the
poller shutdown that can hang (gyre/lifecycle.py). The test session holds it from tests/conftest.py."""

from __future__ import annotations

import asyncio
import gc
import threading

import grpc.aio

from gyre.lifecycle import hold_grpc_aio


def _pollers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if "_poll_wrapper" in t.name}


def test_the_grpc_aio_poller_outlives_a_loops_last_channel() -> None:
    hold_grpc_aio()
    hold_grpc_aio()  # idempotent: one reference, whatever the number of calls

    async def open_and_free() -> None:
        async with grpc.aio.insecure_channel("127.0.0.1:9"):
            pass

    before = _pollers()
    for _ in range(3):
        asyncio.run(open_and_free())
        gc.collect()  # a channel releases grpc's runtime when it is freed, not when it is closed
    assert before, "hold_grpc_aio started no poller"
    assert _pollers() == before, "the poller was shut down (and restarted) when a loop freed its channel"
