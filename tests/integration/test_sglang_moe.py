"""The real SGLang serves the tiny Qwen3-MoE on these CPUs with the trainer's log-probs (issue 37, build
point 6). SGLang's Qwen3-MoE never ties lm_head to the embeddings (real Qwen3-MoE checkpoints are untied),
so the model here is the tiny one untied; `check_engine` refuses the tied one (test_bad_engine_config).

    .venv/bin/python -m pytest -q tests/integration/test_sglang_moe.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gyre.engine import EngineClient
from gyre.engine.backends import check_engine
from gyre.model.init import init_model_dir
from gyre.model.logprobs import token_logprobs
from gyre.model.weights import load_model
from services.cell_agent.engine_hosts import create_engine_host
from tests.support.sglang import sglang_section

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(900)]


async def test_sglang_serves_the_tiny_qwen3_moe_with_the_trainers_logprobs(tmp_path: Path) -> None:
    model_dir = init_model_dir(
        tmp_path / "moe", arch="qwen3_moe", size="tiny", seed=0, overrides={"tie_word_embeddings": False}
    )
    section = sglang_section(kv_cache_tokens=32768)
    check_engine(section, model_dir)
    host = create_engine_host(section, model_dir)
    await host.start()
    try:
        prompt = [11, 523, 97, 4001, 18, 77, 1203]
        async with EngineClient(host.url, timeout_s=120) as client:
            result = await client.generate(
                prompt, {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
            )
    finally:
        await host.stop()
    model = load_model(model_dir)
    ids = torch.tensor(prompt + result.output_ids)
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), [0, len(ids)])[len(prompt) - 1 : -1]
    expected = token_logprobs(logits, torch.tensor(result.output_ids))
    gap = (torch.tensor(result.output_logprobs) - expected).abs().max().item()
    assert len(result.output_ids) == 8 and gap <= 1e-4, f"SGLang's MoE log-probs differ by {gap:.2e}"
    assert result.output_ids == logits.argmax(dim=-1).tolist()
