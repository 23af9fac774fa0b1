"""One worker thread for all torch work of a cell's trainer: forward/backward, collectives, optimizer.

Running torch off the event loop keeps gRPC, heartbeats and Redis responsive while a micro-step
computes (torch releases the GIL); running it on *one* thread keeps the trainer's state changes
ordered without locks.

    compute = ComputeThread("trainer")
    result = await compute.run(trainer.accumulate, step)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class ComputeThread:
    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
