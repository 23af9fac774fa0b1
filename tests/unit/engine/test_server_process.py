"""The engine as a standalone process and the backend registry's failure message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gyre.engine import EngineClient, EngineServerError
from services.cell_agent.engine import EngineServer
from tests.support.models import small_dir
from tests.unit.engine.helpers import engine_section, small_model

ROOT = Path(__file__).resolve().parents[3]


def test_standalone_process_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "gyre.yaml"
    config.write_text(f"cell_agent:\n  engine:\n    kv_cache_tokens: 4096\nmodel:\n  path: {small_dir()}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cell_agent.engine", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = json.loads(process.stdout.readline())["url"]
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        info = httpx.get(f"{url}/get_server_info", timeout=10).json()
        assert info["context_length"] == 1024
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_an_unknown_output_source_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"model.*scripted"):
        await EngineServer(engine_section(output_source="oracle"), model_dir=small_dir()).start()


def test_the_embedded_server_refuses_the_sglang_backend() -> None:
    with pytest.raises(ValueError, match="embedded"):
        EngineServer(engine_section(backend="sglang"), model_dir=small_dir())


async def test_a_crashing_step_fails_requests_turns_unhealthy_and_is_raised_on_stop() -> None:
    server = await EngineServer(engine_section(), model_dir=small_dir(), model=small_model()).start()
    source = server.core.source

    def broken(plan: object) -> list[object]:
        raise RuntimeError("kernel exploded")

    source.execute = broken  # type: ignore[method-assign]
    async with EngineClient(server.url) as client:
        with pytest.raises(EngineServerError, match="kernel exploded"):
            await client.generate([1, 2, 3], {"max_new_tokens": 2})
        assert not await client.health()
        with pytest.raises(EngineServerError, match="failed"):
            await client.generate([1], {})
    with pytest.raises(RuntimeError, match="kernel exploded"):
        await server.stop()
