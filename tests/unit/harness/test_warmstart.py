"""Warm start and the reward measurement: a short training run round-trips through an fp16 HF
directory, and a rollout against a scripted engine is scored and recorded like a live execution."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gyre.config.engine import EngineSection
from gyre.engine.client import EngineClient
from gyre.model.files import check_model_dir
from gyre.model.weights import load_model, load_state_dict
from gyre.tasks import TaskRegistry
from gyre.trajectory.templates import template_for_family, template_for_model
from harness.demo_model.policy_eval import prompt_ids, rollout
from harness.demo_model.warmstart import (
    DEFAULT_CHECKPOINT,
    DEMO_MODEL,
    packed_batch,
    save_fp16,
    train,
    transcripts,
)
from services.cell_agent.engine import EngineServer
from tests.support.models import small_dir

CALL = '<tool_call>{"name":"write_file","arguments":{"path":"answer.txt","content":"%s"}}</tool_call>'


def test_packed_batches_predict_exactly_the_target_tokens() -> None:
    batch = packed_batch(transcripts(0), tokens_per_step=1)
    ids, at, labels = batch["input_ids"], batch["predict_at"], batch["labels"]
    assert len(batch["cu_seqlens"]) == 2 and torch.equal(ids[at + 1], labels)
    im_end = template_for_family("chatml").tokenizer.special_id("<|im_end|>")
    assert int(labels[-1]) == im_end  # the transcript ends with an output's end of turn


def test_a_short_warm_start_round_trips_through_an_fp16_directory(tmp_path: Path) -> None:
    model, stats = train(2.0, seed=1, tokens_per_step=1024, base=small_dir(), log_every=0)
    assert stats["steps"] >= 1 and stats["tokens"] > 0
    path = save_fp16(model, tmp_path / "w", stats)
    info = check_model_dir(path)
    assert info.arch.fingerprint() == model.arch.fingerprint() and info.metadata[
        "gyre_warmstart_steps"
    ] == str(stats["steps"])
    assert {e.dtype for e in info.tensors.values()} == {"float16"}
    loaded = dict(load_model(path).named_parameters())
    for name, p in model.named_parameters():
        assert torch.allclose(loaded[name], p.half().float())
    assert template_for_model(path).name == template_for_family("chatml").name  # ships the demo's template


def test_the_shipped_checkpoint_is_a_warm_start_of_the_demo_model() -> None:
    info = check_model_dir(DEFAULT_CHECKPOINT)
    assert (
        info.arch.architecture == "LlamaForCausalLM"
        and info.metadata["gyre_warmstart_source"] == "harness.demo_model.warmstart"
    )
    assert all(info.arch.raw[k] == v for k, v in DEMO_MODEL.items())
    assert sum(p.stat().st_size for p in DEFAULT_CHECKPOINT.iterdir()) < 4 * 1024 * 1024
    assert set(load_state_dict(info)) == set(info.arch.parameter_shapes())


@pytest.mark.parametrize(
    ("script", "reward"),
    [
        ([CALL % "8", "Done."], 1.0),
        ([CALL % "9", "Done."], 0.2),
        ([CALL.replace("}}</", "}</") % "8"], 0.0),  # malformed: the parser rejects it, nothing is written
        (["8"], 0.0),
    ],
)
async def test_rollout_scores_and_records_like_a_live_execution(script: list[str], reward: float) -> None:
    section = EngineSection(output_source="scripted")
    template = template_for_model(DEFAULT_CHECKPOINT)
    task = TaskRegistry().get("add/3+5")
    script_entries = [{"text": s} for s in script]
    async with (
        EngineServer(section, model_dir=DEFAULT_CHECKPOINT, script=script_entries) as engine,
        EngineClient(engine.url) as client,
    ):
        done = await rollout(client, task, template, rid="r")
    assert done.reward == reward
    prompt = prompt_ids(task, template)
    assert done.ids[: len(prompt)] == prompt and not any(done.targets[: len(prompt)])
    sampled = [t for t, is_target in zip(done.ids, done.targets, strict=True) if is_target]
    assert template.tokenizer.decode(sampled).replace("<|im_end|>", "") == "".join(script)
    assert all(lp < 0 for lp, t in zip(done.behaviour_logprobs, done.targets, strict=True) if t)
