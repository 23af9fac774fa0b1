"""The proxy under a LoRA run, against a real embedded engine: a call names the adapter of the weight
version its engine reports, keeps naming the previous one until an answer shows the engine moved on
(the engine still holds it), records the adapter's version as the call's, and asks again when an
engine comes back to the table."""

from __future__ import annotations

import numpy as np
import torch

from gyre.engine import EngineClient
from gyre.engine.adapters import serve_adapter
from gyre.model.lora import LoraAdapter
from gyre.model.lora_spec import LoraSpec, adapter_config
from gyre.model.weights import load_model
from services.cell_agent.engine import EngineServer
from services.proxy.generation import Generation
from services.proxy.metrics import OverheadClock
from services.proxy.routing import EngineSpec, Router
from tests.support.models import small_dir
from tests.unit.engine.helpers import engine_section

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def _adapter(seed: int) -> LoraAdapter:
    arch = load_model(small_dir()).arch
    adapter = LoraAdapter(
        arch, LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))
    ).init_weights(seed)
    with torch.no_grad():
        for b in adapter.lora_B:
            b.copy_(torch.randn(b.shape, generator=torch.Generator().manual_seed(seed)) * 0.3)
    return adapter


async def _call(router: Router, call_id: str) -> Generation:
    call = Generation(
        router,
        execution_id="e1",
        call_id=call_id,
        prompt_ids=np.asarray([5, 6, 7, 8, 9], dtype=np.int32),
        sampling=GREEDY,
        max_new_tokens=6,
        stop_token_ids=frozenset(),
        stream=call_id.endswith("s"),
        clock=OverheadClock(),
        max_attempts=1,
        backoff_s=0.0,
    )
    async for _ in call.run():
        pass
    return call


async def test_calls_name_the_adapter_of_the_version_their_engine_reports() -> None:
    async with (
        EngineServer(engine_section(enable_lora=True, max_lora_rank=8), model_dir=small_dir()) as engine,
        EngineClient(engine.url) as client,
    ):
        for version in (3, 5):
            adapter = _adapter(version)
            config = adapter_config(adapter.spec, adapter.targets, None)
            await serve_adapter(client, version, tensors=adapter.tensors(), config=config)
            if version == 3:
                router = Router(engine_timeout_s=10, drain_timeout_s=1, lora=True)
                router.update([EngineSpec("cell-1", engine.url, 1)], {}, "cell-1")
                first = await _call(router, "c1")
        assert engine.adapters.loaded().keys() == {"policy-v3", "policy-v5"}
        second = await _call(router, "c2s")  # sent before the proxy saw version 5: still on policy-v3
        third = await _call(router, "c3")
        direct = {
            v: await client.generate(
                [5, 6, 7, 8, 9], {**GREEDY, "max_new_tokens": 6}, lora_path=f"policy-v{v}"
            )
            for v in (3, 5)
        }
        router.engines["cell-1"].weight_version = "stale"
        router.engines["cell-1"].serving = False  # drained; a new table brings it back
        router.update([EngineSpec("cell-1", engine.url, 1)], {}, "cell-1")
        fourth = await _call(router, "c4")
        await router.aclose()
    assert first.weight_versions == ["3"] and first.output_ids == direct[3].output_ids
    assert second.weight_versions == ["3"] and second.logprobs == direct[3].output_logprobs
    assert third.weight_versions == ["5"] and third.output_ids == direct[5].output_ids
    assert direct[3].output_logprobs != direct[5].output_logprobs
    assert fourth.weight_versions == ["5"]


async def test_a_run_without_lora_names_no_adapter() -> None:
    async with EngineServer(engine_section(), model_dir=small_dir()) as engine:
        router = Router(engine_timeout_s=10, drain_timeout_s=1)
        router.update([EngineSpec("cell-1", engine.url, 1)], {}, "cell-1")
        call = await _call(router, "c1")
        await router.aclose()
    assert call.weight_versions == ["0"] and len(call.output_ids) == 6
