"""Shared fixtures: hermetic nats-server and redis-server on free loopback ports (never mocks,
never the machine's default ports), with per-test isolation through unique run ids."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest
import redis.asyncio as aioredis
import structlog

from app.stack.servers import ServerProcess, start_nats, start_redis
from gyre.bus import EventBus
from gyre.lifecycle import hold_grpc_aio
from gyre.paths import REPO_ROOT
from gyre.sandbox.launchers.base import EXTRA_LABELS_ENV
from gyre.store import Keys, connect_redis

# Every container this session creates carries its label (services started as subprocesses inherit it), so
# the session's last check finds exactly what it left: the engine's state is shared with other users.
os.environ[EXTRA_LABELS_ENV] = f"gyre.test-session={uuid.uuid4().hex[:12]}"

# Tests create and free gRPC aio servers and channels on a fresh event loop each: without this, the
# last free shuts grpc's poller down and that can hang the session (gyre/lifecycle.py, hold_grpc_aio).
hold_grpc_aio()


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Each test ends with the logging configuration it started with. A test that runs a `gyre` command in
    process (typer's CliRunner) lets it configure structlog and the root handler on the runner's captured
    stderr, which is closed when the command returns; without this every later log line of the session
    failed ("I/O operation on closed file") and took the services of later tests down with it."""
    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)


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
    return REPO_ROOT


def _cli_binary(name: str, package: str) -> Path:
    """A harness CLI from the repo's `node_modules/.bin` (`make setup` / CI run `npm ci`), else from
    `$GYRE_NODE_BIN_DIR`. In CI (`CI` set) a missing binary fails the test; on a developer machine
    without it the test is skipped."""
    candidates = [Path(__file__).resolve().parents[1] / "node_modules" / ".bin" / name]
    if os.environ.get("GYRE_NODE_BIN_DIR"):
        candidates.append(Path(os.environ["GYRE_NODE_BIN_DIR"]) / name)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not installed: CI installs {package} with `npm ci` in the repo root")
    pytest.skip(f"{name} is not installed; run `npm ci` in the repo root or set GYRE_NODE_BIN_DIR")


@pytest.fixture(scope="session")
def container_session() -> Iterator[None]:
    """For every test that creates containers: at the end of the session, none of them is left (the
    engine's list, filtered by this session's label). What is found is named, removed, and fails here."""
    yield
    from gyre.sandbox.containers.engine import ContainerEngineError, connect, resolve_endpoint
    from tests.support.containers import containers_of

    try:
        client = connect(resolve_endpoint(None), 30.0)
    except ContainerEngineError:
        return  # no engine: no container test ran (each one failed or skipped saying so)
    left = containers_of(client)
    for name in left:
        client.containers.get(name).remove(force=True)
    assert left == [], f"containers left at the end of the session: {left}"


@pytest.fixture(scope="session")
def claude_bin() -> Path:
    return _cli_binary("claude", "@anthropic-ai/claude-code@2.1.332")


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    return _cli_binary("codex", "@openai/codex")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Nothing a test started outlives the session. A worker process left behind by a failed or
    timed-out test would otherwise keep pytest from exiting (multiprocessing joins its non-daemon
    children at exit), and CI would wait on it until its own limit; each one is named, then killed."""
    leftovers = [*multiprocessing.active_children()]
    leftover_pids = {p.pid for p in leftovers}
    others = [
        c
        for c in psutil.Process().children(recursive=True)
        if c.pid not in leftover_pids and not _is_resource_tracker(c)
    ]
    for child in others:
        try:
            sys.stderr.write(
                f"\nconftest: killing leftover process {child.pid} {' '.join(child.cmdline())[:120]}\n"
            )
            child.kill()
        except psutil.Error:
            pass
    for p in leftovers:
        sys.stderr.write(f"\nconftest: killing leftover worker {p.name} (pid {p.pid})\n")
        p.kill()
        p.join(5)


def _is_resource_tracker(process: psutil.Process) -> bool:
    """multiprocessing's own helper of this process, or torch's shared-memory manager (tensors shared by
    file name, `gyre.engine.tensor_codec`): each exits with this process."""
    try:
        command = " ".join(process.cmdline())
        return "multiprocessing.resource_tracker" in command or "torch_shm_manager" in command
    except psutil.Error:
        return False
