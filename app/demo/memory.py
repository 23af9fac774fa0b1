"""Redis memory from step to step of a run: the bounded-state check on a real run (`gyre demo`, `gyre bench
faults`), next to `gyre bench load`'s synthetic one.

    memory = RedisMemory(config.redis.url, config.redis.login_for("cli"))
    memory.sample(step=4)                     # once per committed step, as the demo sees it
    memory.by_step, memory.ratio(last=12, base=4)
    memory.keys_by_step, memory.dataset_by_step   # what the total is made of
    memory.report(last=12)                    # all of it as the summary's `redis_*` fields

A step's groups leave Redis once it committed (archived first; gyre/store/archive.py), so `used_memory`
after step 12 should be within 1.1× of after step 4. A sample is taken when the demo first sees the step
count reach `step` (it polls every second): executions of the next step are then in flight, as they are at
every other sample. `used_memory` also holds the clients' buffers and the AOF's, which come and go with
what is in flight; the key count and `used_memory_dataset` (the keys and values alone) show whether
anything accumulates.
"""

from __future__ import annotations

from typing import Any

import redis

from gyre.config.infra import ClientLogin


class RedisMemory:
    def __init__(self, url: str, login: ClientLogin | None) -> None:
        auth = {"username": login.user, "password": login.password} if login is not None else {}
        self._client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0, **auth)
        self.by_step: dict[int, int] = {}
        """`used_memory` in bytes after each sampled step count."""
        self.dataset_by_step: dict[int, int] = {}
        """`used_memory_dataset` (keys and values, without clients' and AOF buffers) at the same samples."""
        self.keys_by_step: dict[int, int] = {}
        """Number of keys at the same samples."""

    def sample(self, step: int) -> None:
        """Record the memory and keys for `step` (once); a Redis that does not answer (restarting) is skipped."""
        if step in self.by_step:
            return
        try:
            info: dict[str, Any] = self._client.info("memory")
            keys: int = self._client.dbsize()
        except redis.RedisError:
            return
        self.by_step[step] = int(info["used_memory"])
        self.dataset_by_step[step] = int(info["used_memory_dataset"])
        self.keys_by_step[step] = keys

    def ratio(self, last: int, base: int = 4) -> float | None:
        """used_memory after `last` / after `base` (None when either was not sampled or `last` <= `base`)."""
        if last <= base or last not in self.by_step or not self.by_step.get(base):
            return None
        return round(self.by_step[last] / self.by_step[base], 3)

    def report(self, last: int) -> dict[str, Any]:
        """The `redis_*` fields of a run's summary (`gyre demo`, `gyre bench faults`) after `last` steps."""
        return {
            "redis_used_memory_by_step": dict(sorted(self.by_step.items())),
            "redis_used_memory_ratio_last_vs_4": self.ratio(last),
            "redis_dataset_bytes_by_step": dict(sorted(self.dataset_by_step.items())),
            "redis_keys_by_step": dict(sorted(self.keys_by_step.items())),
        }

    def close(self) -> None:
        self._client.close()
