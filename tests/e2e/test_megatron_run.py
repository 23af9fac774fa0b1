"""The whole system for 2 elastic steps with `cell_agent.trainer.backend: megatron` (megatron-core
GPTModels on CPU, gloo) on a tiny random Qwen3, in the shape of test_elastic_run.py's tiny-Qwen3 run:
`scored_script` engines, a satellite joining a batch mid-way. The core publishes over SGLang's
distributed path (`trainer.publication: distributed`: a gloo weight-update group per rollout engine),
the rollout engines serve the published version, and the published HF directory loads in the
embedded engine and in transformers with the core's own logits.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from app.demo.config import demo_config
from app.demo.run import DemoRun
from gyre.config.engine import EngineSection
from gyre.engine import EngineClient
from gyre.model.files import check_model_dir
from gyre.model.init import init_model_dir
from gyre.model.weights import load_model
from gyre.trainer.checkpoint import latest_checkpoint, read_trainer_info
from services.cell_agent.engine import EngineServer
from tests.e2e.test_elastic_run import SHAPE, WRITE_8, _assert_elastic, _events
from tests.support.audit import assert_audited
from tests.unit.engine.helpers import max_logprob_error

pytestmark = pytest.mark.slow


async def _served_by_the_embedded_engine(published: Path, model: Any) -> float:
    """Largest log-prob difference between the embedded engine serving `published` and `model`."""
    async with (
        EngineServer(EngineSection(kv_cache_tokens=4096), model_dir=published) as engine,
        EngineClient(engine.url) as client,
    ):
        ids = list(range(100, 140))
        result = await client.generate(ids, {"max_new_tokens": 4, "ignore_eos": True})
        return max_logprob_error(model, ids, result, 1.0)


def test_two_elastic_megatron_steps_on_a_tiny_qwen3(tmp_path: Path) -> None:
    model_dir = init_model_dir(tmp_path / "qwen3-tiny", arch="qwen3", size="tiny", seed=0)
    script = tmp_path / "script.jsonl"
    script.write_text("\n".join(json.dumps({"text": t}) for t in (WRITE_8, "Done.")) + "\n")
    config = demo_config(
        None,
        {
            "run": {"id": "e2emegatron", "dir": str(tmp_path / "runs")},
            "model": {"path": str(model_dir)},
            "cell_agent": {
                "engine": {
                    "output_source": "scored_script",
                    "script_file": str(script),
                    "script_repeat": True,
                },
                "trainer": {"backend": "megatron", "publication": "distributed"},
            },
            **SHAPE,
        },
    )
    summary = DemoRun(config, steps=2).execute()
    events = _events(config.run.path)
    _assert_elastic(summary, events)
    assert_audited(config.run.path, steps=2)  # replayed with the megatron backend the run trained with

    published = [e["event"] for e in events if e["type"] == "gyre.v1.WeightsPublished"]
    assert int(published[-1]["policyVersion"]) == 2
    assert published[-1].get("engineIds"), (
        "the distributed push reached a rollout engine, which serves version 2"
    )
    back = [
        e["event"]
        for e in events
        if e["type"] == "gyre.v1.RoleTransitionCompleted" and e["event"].get("toRole") == "CELL_ROLE_ROLLOUT"
    ]
    assert any(int(e.get("weightVersion", 0)) == 2 for e in back), (
        "a rollout engine serves the published version"
    )

    checkpoint = latest_checkpoint(config.run.path / "checkpoints")
    assert checkpoint is not None and checkpoint.name == "step-00000002"
    assert read_trainer_info(checkpoint)["backend"] == "megatron"
    directory = config.run.path / "checkpoints" / "published" / "v00000002"
    assert check_model_dir(directory).policy_version == 2
    trainer = load_model(checkpoint)  # the core's own weights after step 2, in HF format
    assert asyncio.run(_served_by_the_embedded_engine(directory, trainer)) <= 1e-4, (
        "the embedded engine loads them"
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    initial = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.arange(100, 164)
    with torch.no_grad():
        theirs = hf(ids[None]).logits[0]
        assert float((trainer(ids, torch.arange(64), [0, 64]) - theirs).abs().max()) <= 1e-5
        assert float((initial(ids[None]).logits[0] - theirs).abs().max()) > 1e-6, (
            "two steps changed the weights"
        )
