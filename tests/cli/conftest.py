"""Fixtures of the real-harness conformance tests: the unmodified Claude Code and Codex CLIs from
npm, driven against a running proxy whose engine is scripted (it stands in for the model; the
harness is what is under test).

The `claude_bin` / `codex_bin` fixtures are in tests/conftest.py (the e2e runs on the CLIs use them too).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.stack.servers import ServerProcess
from tests.support.proxy_stack import ProxyStack, proxy_stack, scripted_engine


@pytest.fixture
async def stack(
    nats_server: ServerProcess, redis_server: ServerProcess, tmp_path: Path, run_id: str
) -> AsyncIterator[ProxyStack]:
    async with proxy_stack(
        nats_server.url, redis_server.url, tmp_path, run_id, {"cell-0": scripted_engine()}
    ) as s:
        yield s


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    workdir: Path


async def run_cli(
    argv: list[str], env: Mapping[str, str], workdir: Path, stdin: bytes | None = None, timeout_s: float = 240
) -> CliRun:
    """Run a harness CLI without blocking the event loop the proxy serves on."""
    workdir.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env={**os.environ, **env},
        cwd=workdir,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return CliRun(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"), workdir)
