"""RedisMemory against a real redis-server: one sample per step, the ratio only between two samples, and a
Redis that does not answer is skipped rather than failing the run."""

from __future__ import annotations

import redis as redis_sync

from app.demo.memory import RedisMemory
from app.stack.servers import ServerProcess


def test_samples_once_per_step_and_the_ratio_needs_both_steps(redis_server: ServerProcess) -> None:
    memory = RedisMemory(redis_server.url, None)
    memory.sample(4)
    first = memory.by_step[4]
    writer = redis_sync.Redis.from_url(redis_server.url)
    writer.set("test-memory-ballast", b"x" * 2_000_000)
    try:
        memory.sample(4)  # already sampled: kept
        assert memory.by_step[4] == first
        memory.sample(12)
        assert memory.by_step[12] >= first + 2_000_000
        assert memory.dataset_by_step[12] >= memory.dataset_by_step[4] + 2_000_000
        assert memory.keys_by_step[12] == memory.keys_by_step[4] + 1
        ratio = memory.ratio(12)
        assert ratio is not None and ratio > 1.1
        assert memory.ratio(4) is None and memory.ratio(13) is None and memory.ratio(12, base=3) is None
    finally:
        writer.delete("test-memory-ballast")
        writer.close()
        memory.close()


def test_a_redis_that_does_not_answer_is_skipped() -> None:
    memory = RedisMemory("redis://127.0.0.1:1", None)  # nothing listens on port 1
    memory.sample(4)
    assert memory.by_step == {} and memory.dataset_by_step == {} and memory.keys_by_step == {}
    assert memory.ratio(12) is None
    memory.close()
