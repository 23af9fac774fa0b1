"""Warm start and the reward measurement: a tiny training run round-trips through a checkpoint,
and a rollout against a scripted engine is scored and recorded like a live execution."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gyre.config.engine import EngineSection
from gyre.engine.client import EngineClient
from gyre.model.checkpoint import load_checkpoint, read_checkpoint
from gyre.model.config import ModelConfig
from gyre.trajectory.templates import EmbeddedTemplate
from harness.policy_eval import prompt_ids, rollout
from harness.tasks import TaskRegistry
from harness.warmstart import (
    DEFAULT_CHECKPOINT,
    ensure_checkpoint,
    packed_batch,
    save_fp16,
    train,
    transcripts,
)
from services.cell_agent.engine import EngineServer

TINY = ModelConfig(num_layers=1, d_model=32, num_heads=2, ffn_hidden=64)
CALL = '<tool_call>{"name":"write_file","arguments":{"path":"answer.txt","content":"%s"}}</tool_call>'


def test_packed_batches_predict_exactly_the_target_tokens() -> None:
    batch = packed_batch(transcripts(0), tokens_per_step=1)
    ids, at, labels = batch["input_ids"], batch["predict_at"], batch["labels"]
    assert len(batch["cu_seqlens"]) == 2 and torch.equal(ids[at + 1], labels)
    assert int(labels[-1]) == EmbeddedTemplate().im_end  # the transcript ends with an output's end of turn


def test_a_short_warm_start_round_trips_through_an_fp16_checkpoint(tmp_path: Path) -> None:
    model, stats = train(2.0, seed=1, tokens_per_step=1024, config=TINY, log_every=0)
    assert stats["steps"] >= 1 and stats["tokens"] > 0
    path = save_fp16(model, tmp_path / "w.safetensors", stats)
    config, tensors, metadata = read_checkpoint(path)
    assert config == TINY and metadata["steps"] == str(stats["steps"])
    assert all(t.dtype == torch.float16 for t in tensors.values())
    loaded, _ = load_checkpoint(path)
    for name, p in model.named_parameters():
        assert torch.allclose(dict(loaded.named_parameters())[name], p.half().float())
    assert ensure_checkpoint(path, seconds=1000.0) == path  # present: nothing is trained


def test_the_shipped_checkpoint_is_a_warm_start_of_the_default_model() -> None:
    config, _, metadata = read_checkpoint(DEFAULT_CHECKPOINT)
    assert config == ModelConfig() and metadata["source"] == "harness.warmstart"
    assert DEFAULT_CHECKPOINT.stat().st_size < 4 * 1024 * 1024


@pytest.mark.parametrize(("script", "reward"), [
    ([CALL % "8", "Done."], 1.0),
    ([CALL % "9", "Done."], 0.2),
    ([CALL.replace("}}</", "}</") % "8"], 0.0),  # malformed: the parser rejects it, nothing is written
    (["8"], 0.0),
])
async def test_rollout_scores_and_records_like_a_live_execution(script: list[str], reward: float) -> None:
    section = EngineSection(output_source="scripted")
    template = EmbeddedTemplate()
    task = TaskRegistry().get("add/3+5")
    async with EngineServer(section, script=[{"text": s} for s in script]) as engine, EngineClient(engine.url) as client:
        done = await rollout(client, task, template, rid="r")
    assert done.reward == reward
    prompt = prompt_ids(task, template)
    assert done.ids[: len(prompt)] == prompt and not any(done.targets[: len(prompt)])
    sampled = [t for t, is_target in zip(done.ids, done.targets, strict=True) if is_target]
    assert template.tokenizer.decode(sampled).replace("<|im_end|>", "") == "".join(script)
    assert all(lp < 0 for lp, t in zip(done.behaviour_logprobs, done.targets, strict=True) if t)
