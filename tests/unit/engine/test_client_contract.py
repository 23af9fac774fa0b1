"""The engine client's contract, run over real HTTP against every registered output source.

Whatever produces the tokens (`model` or `scripted`), the SGLang-native API must behave the same:
shapes and counts of results, streaming (cumulative and incremental servers), abort, pause/continue,
flush, memory release/resume, weight updates, health, info, KV migration and error mapping.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
import torch

from gyre.config import ConfigError
from gyre.engine import EngineClient, EngineNotFound, EngineRequestError
from gyre.engine.migration import migrate_request_kv
from services.cell_agent.engine import EngineServer
from services.cell_agent.engine.sources import OUTPUT_SOURCES, check_output_source
from tests.support.eventually import eventually
from tests.unit.engine.helpers import (
    engine_section,
    prompt,
    running_at_least,
    serve,
    steps_at_least,
)


@dataclass
class Engine:
    name: str
    server: EngineServer
    client: EngineClient

    async def expect(self, num_tokens: int, **entry: object) -> None:
        """Make the next request produce `num_tokens` tokens (queues a script for `scripted`)."""
        if self.name in ("scripted", "scored_script"):
            ids = [65 + i % 26 for i in range(num_tokens)]
            response = await self.client.request(
                "POST", "/gyre/script", json={"entries": [{"output_ids": ids, "finish": "length", **entry}]}
            )
            assert response.status_code == 200


@pytest_asyncio.fixture(params=sorted(OUTPUT_SOURCES), loop_scope="function")
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[Engine]:
    async with serve(engine_section(output_source=request.param)) as (server, client):
        yield Engine(request.param, server, client)


async def test_generate_result_shape(engine: Engine) -> None:
    ids = prompt(12, 0)
    await engine.expect(6)
    result = await engine.client.generate(ids, {"max_new_tokens": 6, "ignore_eos": True}, rid="c1")
    assert result.rid == "c1" and result.prompt_tokens == 12
    assert result.completion_tokens == len(result.output_ids) == len(result.output_logprobs) == 6
    assert result.finish_reason is not None and result.finish_reason.type == "length"
    assert result.weight_version == "0" and all(lp <= 0 for lp in result.output_logprobs)
    triples = result.meta_info["output_token_logprobs"]
    assert [t[1] for t in triples] == result.output_ids and all(t[2] is None for t in triples)
    await engine.expect(1)
    with_text = await engine.client.generate(ids, {"max_new_tokens": 1}, return_text_in_logprobs=True)
    assert isinstance(with_text.meta_info["output_token_logprobs"][0][2], str)


@pytest.mark.parametrize("incremental", [True, False])
async def test_stream_chunks_add_up_to_the_result(incremental: bool) -> None:
    for name in sorted(OUTPUT_SOURCES):
        section = engine_section(output_source=name, incremental_streaming_output=incremental)
        async with serve(section) as (server, client):
            engine = Engine(name, server, client)
            await engine.expect(9)
            chunks = [
                c
                async for c in client.generate_stream(prompt(5, 1), {"max_new_tokens": 9, "ignore_eos": True})
            ]
            assert chunks[-1].finished and not any(c.finished for c in chunks[:-1])
            final = chunks[-1].to_result()
            assert final.completion_tokens == 9 == len(final.output_ids) == len(final.output_logprobs)
            assert [t for c in chunks for t in c.new_output_ids] == final.output_ids
            assert [lp for c in chunks for lp in c.new_logprobs] == final.output_logprobs
            assert "".join(c.new_text for c in chunks) == final.text


async def test_abort_ends_the_call_with_abort(engine: Engine) -> None:
    await engine.expect(900, token_interval_s=0.005)
    task = asyncio.create_task(
        engine.client.generate(prompt(4, 2), {"max_new_tokens": 900, "ignore_eos": True}, rid="a")
    )
    await eventually(lambda: running_at_least(engine.client, 1), what="the request to run")
    await engine.client.abort("a")
    result = await task
    assert result.finish_reason is not None and result.finish_reason.aborted
    assert result.completion_tokens < 900


async def test_pause_continue_flush_and_memory(engine: Engine) -> None:
    client = engine.client
    await client.pause_generation("in_place")
    await engine.expect(3)
    task = asyncio.create_task(client.generate(prompt(4, 3), {"max_new_tokens": 3, "ignore_eos": True}))
    await asyncio.sleep(0.05)  # scenario: a paused engine answers nothing meanwhile
    assert not task.done()
    await client.continue_generation()
    assert (await task).completion_tokens == 3
    assert await client.flush_cache()
    await client.release_memory_occupation(["kv_cache"])
    assert not await client.health()
    await client.resume_memory_occupation(["kv_cache"])
    assert await client.health() and await client.health_generate()


async def test_weight_update_and_info(engine: Engine) -> None:
    client = engine.client
    params = {"model.norm.weight": torch.ones(32)}
    await client.update_weights_from_tensor(params, weight_version="5")
    assert await client.get_weight_version() == "5"
    info = await client.get_model_info()
    assert info["weight_version"] == "5" and info["is_generation"] is True
    server_info = await client.get_server_info()
    assert server_info["engine"] == "gyre-embedded" and server_info["output_source"] == engine.name
    assert server_info["internal_states"][0]["num_running_reqs"] == 0
    await engine.expect(2)
    assert (
        await client.generate(prompt(3, 4), {"max_new_tokens": 2, "ignore_eos": True})
    ).weight_version == "5"


async def test_errors_map_to_client_exceptions(engine: Engine) -> None:
    client = engine.client
    with pytest.raises(EngineRequestError, match="top_p"):
        await client.generate([1, 2], {"top_p": 5})
    with pytest.raises(EngineNotFound):
        await client.export_kv("kv-unknown")
    with pytest.raises(EngineNotFound):
        await client.pin_kv("no-such-request")
    await engine.expect(900, token_interval_s=0.005)
    task = asyncio.create_task(client.generate([1], {"max_new_tokens": 900, "ignore_eos": True}, rid="dup"))
    await eventually(lambda: running_at_least(client, 1), what="the request to run")
    with pytest.raises(EngineRequestError, match="Duplicate"):
        await client.generate([1], {"max_new_tokens": 1}, rid="dup")
    await client.abort("dup")
    await task


async def test_kv_migration_between_two_engines(engine: Engine) -> None:
    async with serve(engine_section(output_source=engine.name)) as (_, destination):
        await engine.expect(900, token_interval_s=0.005)
        ids = prompt(40, 5)
        task = asyncio.create_task(
            engine.client.generate(ids, {"max_new_tokens": 900, "ignore_eos": True}, rid="mv")
        )
        await eventually(lambda: steps_at_least(engine.client, 3), what="three engine steps")
        moved = await migrate_request_kv(engine.client, destination, "mv")
        first = await task
        assert first.finish_reason is not None and first.finish_reason.aborted
        assert moved.num_tokens == moved.pinned_tokens >= len(ids)
        if engine.name in ("scripted", "scored_script"):
            await destination.request(
                "POST", "/gyre/script", json={"entries": [{"output_ids": [66], "finish": "length"}]}
            )
        again = await destination.generate(
            [*ids, *first.output_ids], {"max_new_tokens": 1, "ignore_eos": True}
        )
        assert again.cached_tokens == moved.num_tokens


def test_an_unregistered_output_source_stops_the_engine_naming_the_field() -> None:
    assert check_output_source("model") is OUTPUT_SOURCES["model"]
    with pytest.raises(ConfigError, match=r"cell_agent\.engine\.output_source: 'replay' is not an engine"):
        check_output_source("replay")
