"""Acceptance (LoRA serving): the embedded engine serves base + adapter with SGLang's endpoints and
per-request `lora_path`, its log-probs equal `peft` + transformers within 1e-4 (concurrent requests
mixing two adapters and the base model in one batch), the prefix cache is keyed by adapter and load,
an unload lets running requests finish, KV moves only to an engine serving the same adapter, and bad
requests get SGLang's answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
import transformers

from gyre.engine import EngineClient, EngineRequestError
from gyre.engine.migration import migrate_request_kv
from gyre.model.logprobs import token_logprobs
from gyre.model.lora import LoraAdapter, write_adapter_dir
from gyre.model.lora_spec import LoraSpec, adapter_config
from gyre.model.weights import load_model
from services.cell_agent.engine import EngineServer
from tests.support.eventually import eventually
from tests.support.models import hf_dir
from tests.unit.engine.helpers import engine_section, engine_stats, steps_at_least

TOL = 1e-4
LORA = {"enable_lora": True, "max_lora_rank": 8, "max_loaded_loras": 3}


def _adapter(path: Path, seed: int, rank: int, targets: tuple[str, ...]) -> LoraAdapter:
    model = load_model(path)
    adapter = LoraAdapter(
        model.arch, LoraSpec(rank=rank, alpha=2.0 * rank, target_modules=targets)
    ).init_weights(seed)
    gen = torch.Generator().manual_seed(seed + 50)
    with torch.no_grad():
        for b in adapter.lora_B:
            b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
    return adapter


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _reference(base: Path, adapter_dir: Path | None) -> Any:
    hf = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return (hf if adapter_dir is None else peft.PeftModel.from_pretrained(hf, str(adapter_dir))).eval()


def _error(model: Any, ids: list[int], result: Any, temperature: float) -> float:
    full = torch.tensor([[*ids, *result.output_ids]])
    with torch.no_grad():
        logits = model(input_ids=full).logits[0]
    ref = token_logprobs(logits[len(ids) - 1 : -1], torch.tensor(result.output_ids), temperature)
    return float((torch.tensor(result.output_logprobs) - ref).abs().max())


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root, base = tmp_path_factory.mktemp("lora"), hf_dir("qwen3")
    a = write_adapter_dir(
        root / "a", _adapter(base, 1, 4, ("q_proj", "v_proj", "down_proj")), base_model=base
    )
    b = write_adapter_dir(root / "b", _adapter(base, 2, 8, ("o_proj", "gate_proj")), base_model=base)
    return base, a, b


async def test_requests_on_two_adapters_and_the_base_equal_peft(adapters: tuple[Path, Path, Path]) -> None:
    base, a, b = adapters
    vocab = load_model(base).arch.vocab_size
    section = engine_section(block_size=8, max_batch_size=8, max_prefill_tokens=64, **LORA)
    prefix = _ids(40, 1, vocab)
    prompts = [prefix + _ids(3 + i, 10 + i, vocab) for i in range(6)]
    names = ["a", None, "b", "a", "b", None]
    temps = [1.0, 0.7, 1.3, 0.0, 1.0, 0.9]
    async with EngineServer(section, model_dir=base) as engine, EngineClient(engine.url) as client:
        loaded = await client.load_lora_adapter("a", str(a))
        assert loaded == {"a": str(a)}
        await client.load_lora_adapter("b", str(b))

        async def one(i: int) -> Any:
            await asyncio.sleep(0.005 * i)  # scenario: staggered, later requests join a running batch
            params = {"max_new_tokens": 10, "ignore_eos": True, "temperature": temps[i]}
            return await client.generate(prompts[i], params, lora_path=names[i])

        results = await asyncio.gather(*(one(i) for i in range(6)))
        stats = await engine_stats(client)
    assert stats["num_steps"] < 6 * 10, "requests on different adapters shared steps"
    assert stats["lora_adapters_loaded"] == 2 and stats["lora_requests_in_flight"] == 0
    refs = {None: _reference(base, None), "a": _reference(base, a), "b": _reference(base, b)}
    for prompt, name, temperature, result in zip(prompts, names, temps, results, strict=True):
        assert _error(refs[name], prompt, result, temperature or 1.0) <= TOL, name


async def test_the_prefix_cache_is_keyed_by_adapter_and_load(adapters: tuple[Path, Path, Path]) -> None:
    base, a, b = adapters
    prompt = _ids(64, 3, load_model(base).arch.vocab_size)
    params = {"max_new_tokens": 2, "ignore_eos": True}
    section = engine_section(block_size=8, **LORA)
    async with EngineServer(section, model_dir=base) as engine, EngineClient(engine.url) as client:
        await client.load_lora_adapter("a", str(a))
        await client.load_lora_adapter("b", str(b))
        assert (await client.generate(prompt, params, lora_path="a")).cached_tokens == 0
        assert (await client.generate(prompt, params, lora_path="a")).cached_tokens >= 56
        assert (await client.generate(prompt, params, lora_path="b")).cached_tokens == 0
        assert (await client.generate(prompt, params)).cached_tokens == 0
        await client.unload_lora_adapter("a")
        await client.load_lora_adapter("a", str(b))  # the same name, another adapter
        assert (await client.generate(prompt, params, lora_path="a")).cached_tokens == 0


async def test_an_unload_lets_running_requests_finish(adapters: tuple[Path, Path, Path]) -> None:
    base, a, _ = adapters
    section = engine_section(**LORA)
    async with EngineServer(section, model_dir=base) as engine, EngineClient(engine.url) as client:
        await client.load_lora_adapter("a", str(a))
        running = asyncio.create_task(
            client.generate(_ids(20, 4, 100), {"max_new_tokens": 120, "ignore_eos": True}, lora_path="a")
        )

        async def in_flight() -> bool:
            return bool((await engine_stats(client)).get("lora_requests_in_flight", 0))

        await eventually(in_flight, what="an adapter's request in flight")
        left = await client.unload_lora_adapter("a")
        result = await running
        assert left == {} and result.finish_reason.type == "length" and len(result.output_ids) == 120
        with pytest.raises(EngineRequestError, match="not loaded: a"):
            await client.generate([1, 2, 3], {"max_new_tokens": 1}, lora_path="a")


async def test_kv_moves_only_to_an_engine_serving_the_same_adapter(adapters: tuple[Path, Path, Path]) -> None:
    base, a, b = adapters
    section = engine_section(max_prefill_tokens=16, **LORA)
    ids = _ids(50, 5, 100)
    async with (
        EngineServer(section, model_dir=base) as source_engine,
        EngineServer(section, model_dir=base) as same_engine,
        EngineServer(section, model_dir=base) as other_engine,
        EngineClient(source_engine.url) as source,
        EngineClient(same_engine.url) as same,
        EngineClient(other_engine.url) as other,
    ):
        await source.load_lora_adapter("a", str(a))
        await same.load_lora_adapter("a", str(a))
        await other.load_lora_adapter("b", str(b))
        moved, firsts = [], []
        for destination, rid in ((same, "m1"), (other, "m2")):
            steps = (await engine_stats(source))["num_steps"]
            task = asyncio.create_task(
                source.generate(ids, {"max_new_tokens": 300, "ignore_eos": True}, rid=rid, lora_path="a")
            )
            await eventually(lambda s=steps: steps_at_least(source, s + 8), what="eight more engine steps")
            moved.append(await migrate_request_kv(source, destination, rid))
            firsts.append(await task)
        continued = [*ids, *firsts[0].output_ids]
        result = await same.generate(continued, {"max_new_tokens": 8, "ignore_eos": True}, lora_path="a")
    assert moved[0].num_tokens >= 50 and result.cached_tokens == moved[0].num_tokens
    assert moved[1].num_tokens == 0 and "does not serve" in str(moved[1].reason)
    assert _error(_reference(base, a), continued, result, 1.0) <= TOL


async def test_adapters_sent_as_tensors_and_bad_requests(adapters: tuple[Path, Path, Path]) -> None:
    base, a, _ = adapters
    adapter = _adapter(base, 1, 4, ("q_proj", "v_proj", "down_proj"))
    big = _adapter(base, 3, 16, ("q_proj",))
    async with (
        EngineServer(engine_section(**LORA), model_dir=base) as engine,
        EngineServer(engine_section(), model_dir=base) as plain,
        EngineClient(engine.url) as client,
        EngineClient(plain.url) as plain_client,
    ):
        config = adapter_config(adapter.spec, adapter.targets, str(base))
        await client.load_lora_adapter_from_tensors("t", adapter.tensors(), config)
        await client.load_lora_adapter("a", str(a))
        prompt = [5, 6, 7, 8]
        params = {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0.0}
        from_tensors = await client.generate(prompt, params, lora_path="t")
        from_dir = await client.generate(prompt, params, lora_path="a")
        assert from_tensors.output_ids == from_dir.output_ids
        assert from_tensors.output_logprobs == pytest.approx(from_dir.output_logprobs, abs=1e-6)
        for call, message in (
            (client.load_lora_adapter("a", str(a)), "LoRA with name a already exists"),
            (client.load_lora_adapter("x", str(base)), "adapter_config.json: missing"),
            (client.unload_lora_adapter("nope"), "LoRA with name nope does not exist"),
            (client.generate(prompt, params, lora_path="nope"), "not loaded: nope"),
            (plain_client.load_lora_adapter("a", str(a)), "LoRA is not enabled"),
            (plain_client.generate(prompt, params, lora_path="a"), "serves no LoRA adapters"),
            (
                client.load_lora_adapter_from_tensors(
                    "big", big.tensors(), adapter_config(big.spec, big.targets, None)
                ),
                "above --max-lora-rank 8",
            ),
        ):
            with pytest.raises(EngineRequestError, match=message):
                await call
        reply = await client.request("POST", "/generate", json={"input_ids": prompt, "lora_path": ["a"]})
        assert reply.status_code == 400 and "a batch" in reply.json()["error"]["message"]
        await client.load_lora_adapter("c", str(a))
        with pytest.raises(EngineRequestError, match="Maximum number of loaded LoRA adapters is 3"):
            await client.load_lora_adapter("d", str(a))
