"""The hosted rollout engine across a role switch: in-flight requests are handed back (aborted, none
lost), memory is released and resumed, the newest published weights are served with their version.
Both hosts: the embedded engine in-process, and the HTTP host (the SGLang path) against the embedded
engine's SGLang-native HTTP API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gyre.config.engine import EngineSection
from gyre.engine import EngineClient, GenerateResult
from gyre.engine.backends import ENGINE_BACKENDS
from gyre.trainer.checkpoint import write_published
from services.cell_agent.engine import EngineServer
from services.cell_agent.engine_hosts import ENGINE_HOSTS, EmbeddedEngineHost, EngineHost, HttpEngineHost
from tests.support.eventually import eventually
from tests.unit.cell_agent.helpers import SMALL, trainer

SECTION = EngineSection(kv_cache_tokens=4096, max_batch_size=8)
LONG = {"max_new_tokens": 200, "ignore_eos": True, "temperature": 1.0}


@asynccontextmanager
async def _host(kind: str) -> AsyncIterator[EngineHost]:
    if kind == "embedded":
        host: EngineHost = EmbeddedEngineHost(SECTION, SMALL.require_path())
        await host.start()
        try:
            yield host
        finally:
            await host.stop()
        return
    async with EngineServer(SECTION, model_dir=SMALL.require_path()) as server:
        host = HttpEngineHost(SECTION, SMALL.require_path(), base_url=server.url)
        await host.start()
        try:
            yield host
        finally:
            await host.stop()


async def _running(client: EngineClient, n: int) -> None:
    async def enough() -> bool:
        states = (await client.get_server_info())["internal_states"][0]
        return bool(states["num_running_reqs"] + states["num_waiting_reqs"] >= n)

    await eventually(enough, what=f"{n} requests in flight")


@pytest.mark.parametrize("kind", ["embedded", "http"])
async def test_switch_cycle(kind: str, tmp_path: Path) -> None:
    t = trainer()
    t.flat_params.add_(0.01)  # weights the engine does not have yet
    path = write_published(
        tmp_path, version=5, arch=t.arch, tensors=t.named_weights(), source=SMALL.require_path()
    )
    async with _host(kind) as host, EngineClient(host.url, timeout_s=60) as client:
        calls = [asyncio.create_task(client.generate([1, 2, 3, i], LONG)) for i in range(3)]
        await _running(client, 3)
        assert await host.hand_back() == 3
        results = await asyncio.gather(*calls, return_exceptions=True)
        for r in results:
            assert (
                isinstance(r, GenerateResult) and r.finish_reason is not None and r.finish_reason.aborted
            ), r
        await host.release(weights=True)
        assert not await client.health_generate(timeout_s=0.3), (
            "nothing is served while the memory is released"
        )
        await host.resume()
        await host.load_weights(path, 5)
        await host.reopen()
        await host.wait_ready(10)
        assert await host.weight_version() == "5"
        again = await client.generate([1, 2, 3], {"max_new_tokens": 4})
        assert again.weight_version == "5" and not (again.finish_reason and again.finish_reason.aborted)


async def test_push_weights_flushes_the_prefix_cache() -> None:
    async with _host("embedded") as host, EngineClient(host.url, timeout_s=60) as client:
        prompt = list(range(40, 90))
        await client.generate(prompt, {"max_new_tokens": 1})
        warm = await client.generate(prompt, {"max_new_tokens": 1})
        assert warm.cached_tokens > 0
        t = trainer()
        await host.push_weights(t.named_weights(), 2)
        after = await client.generate(prompt, {"max_new_tokens": 1})
        assert after.cached_tokens == 0 and after.weight_version == "2"


def test_every_engine_backend_has_a_host() -> None:
    """The config's names (`gyre.engine.backends`, what `check_engine` accepts) are the hosts' registry."""
    assert set(ENGINE_HOSTS) == set(ENGINE_BACKENDS)
    for name, cls in ENGINE_HOSTS.items():
        assert cls.name == name
