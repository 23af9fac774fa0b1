"""Shared fixtures: hermetic nats-server and redis-server on free loopback ports (never mocks,
never the machine's default ports), with per-test isolation through unique run ids."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gyre.bus import EventBus
from gyre.stack.servers import ServerProcess, start_nats, start_redis
from gyre.store import Keys, connect_redis


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_nats(tmp_path_factory.mktemp("nats"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_redis(tmp_path_factory.mktemp("redis"), appendonly=False)
    yield server
    server.stop()


@pytest.fixture
def run_id() -> str:
    """A fresh run id per test: subjects, streams and keys never collide between tests."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def bus(nats_server: ServerProcess, run_id: str) -> AsyncIterator[EventBus]:
    b = await EventBus.connect(nats_server.url, run_id=run_id, source="test")
    yield b
    await b.close()


@pytest.fixture
async def redis(redis_server: ServerProcess) -> AsyncIterator[aioredis.Redis]:
    client = await connect_redis(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def keys(run_id: str) -> Keys:
    return Keys(run_id)


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
