"""The engine contract, run against every registered engine back end (`services.cell_agent.engine_hosts`):
the embedded engine and the real SGLang (launched on these CPUs from `.venv-sglang`) pass the same tests.

    .venv/bin/python -m pytest -q tests/integration/test_engine_backends.py

Each back end serves a tiny Qwen3 in float32, one server per back end for the whole module (SGLang takes
26–45 s to start here). The reference is the trainer's model (`gyre.model`, float32) on the same weights:
served output ids are its greedy choices and served log-probs equal its log-probs within 1e-4, before and
after a weight update, and after the core's publication in each mode (tensor, distributed, disk). Also:
streaming gives what a whole call gives, abort by rid ends a call in flight with an `abort` finish,
`flush_cache` empties the prefix cache, a role switch hands back every call in flight, an update with a
call running flushes the cache and keeps the call; and a killed SGLang server is restarted by its launcher
with the newest publication the cell names, and serves it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from gyre.config.engine import EngineSection
from gyre.config.training import TrainerSection
from gyre.engine import EngineClient, GenerateResult
from gyre.engine.backends import check_engine
from gyre.model.logprobs import token_logprobs
from gyre.model.weights import load_model
from gyre.rl.loss import ObjectiveParams
from gyre.trainer.backends import TrainerSpec, create_trainer
from gyre.trainer.checkpoint import write_published
from services.cell_agent.engine_hosts import ENGINE_HOSTS, EngineHost, SGLangEngineHost, create_engine_host
from services.cell_agent.publication import Publisher
from tests.support.eventually import eventually
from tests.support.models import hf_dir
from tests.support.sglang import sglang_section

# SGLang starts in 30 s on an idle core here and took 200 s on a loaded machine: the start counts in a test.
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]

MODEL_DIR = hf_dir("qwen3")
KV_TOKENS = 32768  # the model's context: one call of any length fits (check_engine)
GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
LONG = {"max_new_tokens": 4000, "temperature": 1.0, "ignore_eos": True}
TOLERANCE = 1e-4


def section_for(name: str) -> EngineSection:
    if name == "sglang":
        return sglang_section(kv_cache_tokens=KV_TOKENS)
    return EngineSection(backend=name, kv_cache_tokens=KV_TOKENS, max_batch_size=8)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=sorted(ENGINE_HOSTS))
async def host(request: pytest.FixtureRequest) -> AsyncIterator[EngineHost]:
    section = section_for(request.param)
    check_engine(section, MODEL_DIR)
    engine = create_engine_host(section, MODEL_DIR)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def client(host: EngineHost) -> AsyncIterator[EngineClient]:
    async with EngineClient(host.url, timeout_s=120) as c:
        yield c


def reference_logprobs(
    model_dir: Path, prompt: list[int], output: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer model's log-probs of `output` after `prompt`, and the best log-prob at each position."""
    model = load_model(model_dir)
    ids = torch.tensor(prompt + output)
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), [0, len(ids)])[len(prompt) - 1 : -1]
    served = token_logprobs(logits, torch.tensor(output))
    best = torch.log_softmax(logits.float(), dim=-1).max(dim=-1).values
    return served, best


def assert_matches_reference(result: GenerateResult, model_dir: Path, prompt: list[int]) -> None:
    assert len(result.output_ids) == GREEDY["max_new_tokens"] == len(result.output_logprobs), result
    expected, best = reference_logprobs(model_dir, prompt, result.output_ids)
    served = torch.tensor(result.output_logprobs)
    gap = (served - expected).abs().max().item()
    assert gap <= TOLERANCE, f"served log-probs differ from the trainer's by {gap:.2e}"
    assert bool((expected >= best - TOLERANCE).all()), "a served token is not the greedy choice"


async def test_generate_returns_the_trainers_greedy_ids_and_logprobs(client: EngineClient) -> None:
    prompt = [11, 523, 97, 4001, 18, 77, 1203]
    result = await client.generate(prompt, GREEDY)
    assert result.prompt_tokens == len(prompt) and result.finish_reason is not None
    assert result.finish_reason.type == "length"
    assert_matches_reference(result, MODEL_DIR, prompt)
    again = await client.generate(prompt, GREEDY)
    assert again.output_ids == result.output_ids


async def test_streaming_gives_what_a_whole_call_gives(client: EngineClient) -> None:
    prompt = [5, 6, 7, 8, 900]
    whole = await client.generate(prompt, GREEDY)
    ids: list[int] = []
    logprobs: list[float] = []
    finished = None
    async for chunk in client.generate_stream(prompt, GREEDY):
        ids += chunk.new_output_ids
        logprobs += chunk.new_logprobs
        finished = chunk.finish_reason or finished
    assert ids == whole.output_ids
    assert torch.allclose(torch.tensor(logprobs), torch.tensor(whole.output_logprobs), atol=TOLERANCE)
    assert finished is not None and finished.type == "length"


async def test_abort_ends_a_call_in_flight(client: EngineClient) -> None:
    rid = "contract-abort"
    stream = client.generate_stream([1, 2, 3, 4], LONG, rid=rid)
    first = await anext(stream)
    assert not first.finished
    await client.abort(rid)
    last = first
    async for chunk in stream:
        last = chunk
    assert last.finish_reason is not None and last.finish_reason.aborted, last
    assert len(last.output_ids) < LONG["max_new_tokens"]


async def test_flush_cache_empties_the_prefix_cache(client: EngineClient) -> None:
    prompt = list(range(300, 364))
    await client.generate(prompt, {"max_new_tokens": 1})
    warm = await client.generate(prompt, {"max_new_tokens": 1})
    assert warm.cached_tokens > 0
    assert await client.flush_cache()
    cold = await client.generate(prompt, {"max_new_tokens": 1})
    assert cold.cached_tokens == 0


async def test_a_role_switch_hands_back_every_call_in_flight(host: EngineHost, client: EngineClient) -> None:
    streams = [client.generate_stream([1, 2, 3, i], LONG) for i in range(3)]
    for stream in streams:  # every call has its first token: all three are running
        assert not (await anext(stream)).finished
    # SGLang's count comes from gauges its scheduler refreshes every 40 decode steps (`num_in_flight`)
    await eventually(lambda: _counts(host, 3), timeout_s=60, what="the engine to count 3 calls in flight")
    assert await host.hand_back() == 3
    for stream in streams:
        last = None
        async for chunk in stream:
            last = chunk
        assert last is not None and last.finish_reason is not None and last.finish_reason.aborted, last
    await host.reopen()
    await host.wait_ready(30)
    after = await client.generate([1, 2, 3], GREEDY)
    assert after.finish_reason is not None and after.finish_reason.type == "length"


async def _counts(host: EngineHost, n: int) -> bool:
    return await host.num_in_flight() == n


async def test_a_published_update_serves_the_new_weights(
    host: EngineHost, client: EngineClient, tmp_path: Path
) -> None:
    prompt = [42, 43, 44, 45, 46, 47]
    before = await client.generate(prompt, GREEDY)
    trainer = create_trainer(
        "torch", TrainerSpec(TrainerSection(), MODEL_DIR, ObjectiveParams(), with_optimizer=False)
    )
    with torch.no_grad():
        trainer.flat_params.add_(torch.randn_like(trainer.flat_params), alpha=0.05)
    published = write_published(
        tmp_path, version=3, arch=trainer.arch, tensors=trainer.named_weights(), source=MODEL_DIR
    )
    await client.generate(prompt, {"max_new_tokens": 1})  # warm the prefix cache: the update must flush it
    await host.load_weights(published, 3)
    assert await host.weight_version() == "3"
    after = await client.generate(prompt, GREEDY)
    assert after.weight_version == "3" and after.cached_tokens == 0
    assert_matches_reference(after, published, prompt)
    moved = torch.tensor(after.output_logprobs[:1]) - torch.tensor(before.output_logprobs[:1])
    assert moved.abs().max().item() > 1e-3, "the update did not change the served log-probs"
    await host.load_weights(MODEL_DIR, 4)  # back to the base weights for the other tests of the module
    restored = await client.generate(prompt, GREEDY)
    assert restored.output_ids == before.output_ids and restored.weight_version == "4"


async def test_an_update_keeps_a_call_in_flight_and_flushes_the_cache(
    host: EngineHost, client: EngineClient
) -> None:
    """A publication into a rollout engine while a long call runs: the update does not wait for the call
    (SGLang would, then refuse to flush while a request runs: its running requests are retracted and
    continued around the update), the call goes on after it, the engine reports the new version, and no
    prefix from before the update is served."""
    prompt = list(range(300, 364))
    await client.generate(prompt, {"max_new_tokens": 1})
    rid = "contract-update-in-flight"
    stream = client.generate_stream([1, 2, 3, 4], LONG, rid=rid)
    assert not (await anext(stream)).finished
    await asyncio.wait_for(host.load_weights(MODEL_DIR, 5), timeout=120)  # the same weights, a new version
    assert await host.weight_version() == "5"
    await client.abort(rid)  # the call was still running after the update: it ends here, by this abort
    last = None
    async for chunk in stream:
        last = chunk
    assert last is not None and last.finish_reason is not None and last.finish_reason.aborted, last
    assert len(last.output_ids) < LONG["max_new_tokens"]
    cold = await client.generate(prompt, {"max_new_tokens": 1})
    assert cold.cached_tokens == 0 and cold.weight_version == "5"


@pytest.mark.parametrize("mode", ["tensor", "distributed", "disk"])
async def test_each_publication_mode_serves_the_trainers_weights(
    host: EngineHost, client: EngineClient, tmp_path: Path, mode: str
) -> None:
    """The core's publication (`services.cell_agent.publication.Publisher`) in each mode, into the served
    engine: SGLang's serialized tensors (named shared memory, read by a server the trainer did not spawn),
    a gloo weight-update group under SGLang's store keys, and a published directory."""
    prompt = [42, 43, 44, 45, 46, 47]
    trainer = create_trainer(
        "torch", TrainerSpec(TrainerSection(), MODEL_DIR, ObjectiveParams(), with_optimizer=False)
    )
    with torch.no_grad():
        trainer.flat_params.add_(torch.randn_like(trainer.flat_params), alpha=0.05)
    named = trainer.named_weights()
    published = write_published(tmp_path, version=7, arch=trainer.arch, tensors=named, source=MODEL_DIR)
    await client.generate(prompt, {"max_new_tokens": 1})  # warm the prefix cache: the push must flush it
    section = TrainerSection(publication=mode, dist_backend="gloo")
    publisher = Publisher(
        section, bind_host="127.0.0.1", advertise_host="127.0.0.1", timeout_s=120, run_id="contract"
    )
    try:
        await publisher.push(host.url, named, version=7, path=published)
    finally:
        await publisher.close()
    after = await client.generate(prompt, GREEDY)
    assert after.weight_version == "7" and after.cached_tokens == 0
    assert_matches_reference(after, published, prompt)
    await host.load_weights(MODEL_DIR, 8)  # back to the base weights for the other tests of the module


@pytest.mark.parametrize("host", ["sglang"], indirect=True)
async def test_a_killed_sglang_server_is_restarted_with_the_newest_publication(
    host: EngineHost, client: EngineClient, tmp_path: Path
) -> None:
    """The launcher restarts a killed server with what the cell names as its newest publication (not the
    model it was configured with), and the cell's `on_restarted` runs once the new server answers."""
    assert isinstance(host, SGLangEngineHost)
    launcher = host.launcher
    trainer = create_trainer(
        "torch", TrainerSpec(TrainerSection(), MODEL_DIR, ObjectiveParams(), with_optimizer=False)
    )
    with torch.no_grad():
        trainer.flat_params.add_(torch.randn_like(trainer.flat_params), alpha=0.05)
    published = write_published(
        tmp_path, version=9, arch=trainer.arch, tensors=trainer.named_weights(), source=MODEL_DIR
    )
    restored: list[str] = []

    async def newest() -> tuple[Path, int]:
        return published, 9

    async def on_restarted() -> None:
        restored.append(await host.weight_version())

    host.weights_on_restart, host.on_restarted = newest, on_restarted
    first_pid = launcher.pid
    assert first_pid is not None
    try:
        os.killpg(first_pid, signal.SIGKILL)
        await eventually(lambda: not launcher.up, timeout_s=60, interval_s=0.05, what="the death to be seen")
        assert await host.weight_version() == "" and await host.num_in_flight() == 0
        await host.wait_ready(600)  # waits for the restart
        await eventually(lambda: restored, timeout_s=60, interval_s=0.1, what="on_restarted")
        assert launcher.num_restarts == 1 and launcher.pid != first_pid and restored == ["9"]
        prompt = [11, 523, 97, 4001, 18, 77, 1203]
        served = await client.generate(prompt, GREEDY)
        assert served.weight_version == "9"
        assert_matches_reference(served, published, prompt)
    finally:
        host.weights_on_restart = host.on_restarted = None
    await host.load_weights(MODEL_DIR, 10)  # back to the base weights for the other tests of the module
