"""Acceptance (LoRA): one trainer step on an adapter equals the same step computed with `peft` +
transformers and `torch.optim.AdamW` at lr 1e-5; only the adapter gets gradients and optimizer state;
its checkpoint carries the adapter and the optimizer state into a fresh trainer, and the adapter
directory it writes is what `peft.PeftModel.from_pretrained` loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import peft
import pytest
import torch
import transformers

from gyre.config.training import LoraSection, TrainerSection
from gyre.model.lora_spec import WEIGHTS_FILE
from gyre.rl.loss import ObjectiveParams
from gyre.rl.step_loss import train_microstep
from gyre.trainer.backends import TrainerSpec
from gyre.trainer.backends.torch_backend import TorchTrainer
from gyre.trainer.checkpoint import latest_checkpoint, write_published
from gyre.trainer.synthetic import synthetic_microsteps
from tests.support.models import hf_dir
from tests.unit.cell_agent.test_trainer_hf import _hf_logits_fn

TARGETS = {"qwen3": ["q_proj", "v_proj", "down_proj"], "qwen3_moe": ["q_proj", "v_proj", "o_proj"]}
"""Attention and a dense MLP; a MoE model's MLPs are experts, which LoRA does not target."""


def _trainer(arch: str, **section: Any) -> TorchTrainer:
    trainer_section = TrainerSection(
        lr=1e-5,
        weight_decay=0.01,
        grad_clip=0.0,
        lora=LoraSection(rank=4, alpha=8.0, target_modules=TARGETS[arch]),
        **section,
    )
    return TorchTrainer.create(
        TrainerSpec(trainer_section, hf_dir(arch), ObjectiveParams(), with_optimizer=True)
    )


def _trained_b(trainer: TorchTrainer, seed: int) -> None:
    """Give B non-zero values (as after some steps), so the step moves A as well as B."""
    gen = torch.Generator().manual_seed(seed)
    named = {n: t.clone() for n, t in trainer.named_weights().items()}
    for name, tensor in named.items():
        if "lora_B" in name:
            tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.05)
    trainer.load_weights(named, 0)


def _step(trainer: TorchTrainer) -> Any:
    return synthetic_microsteps(
        trainer.model,
        batch_id="b",
        step=0,
        num_groups=2,
        group_size=3,
        token_budget=2048,
        max_row_tokens=120,
        seed=7,
    )[0]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_one_step_on_the_adapter_equals_peft_with_adamw(arch: str) -> None:
    trainer = _trainer(arch)
    _trained_b(trainer, 1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir(arch), dtype=torch.float32)
    theirs = peft.get_peft_model(
        hf, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS[arch])
    )
    theirs.train()
    lora = {n.replace(".default", ""): p for n, p in theirs.named_parameters() if p.requires_grad}
    ours = trainer.named_weights()
    assert set(lora) == set(ours)
    with torch.no_grad():
        for name, p in lora.items():
            p.copy_(ours[name])
    step = _step(trainer)
    trainer.accumulate(step)
    train_microstep(step, _hf_logits_fn(theirs), objective=ObjectiveParams())

    # Only the adapter has gradients and optimizer state.
    assert all(p.grad is None and not p.requires_grad for p in trainer.model.parameters())
    assert trainer.flat_params.numel() == sum(p.numel() for p in lora.values())
    grads = dict(
        zip(
            trainer.flat.slots,
            (trainer.flat.grads[s.offset : s.offset + s.numel] for s in trainer.flat.slots.values()),
            strict=True,
        )
    )
    for name, p in lora.items():
        assert p.grad is not None and float(p.grad.abs().max()) > 0, name
        diff = float((grads[name].view_as(p.grad) - p.grad).abs().max())
        assert diff <= 1e-5 * float(p.grad.abs().max()), name

    optimizer = torch.optim.AdamW(lora.values(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    before = {n: t.clone() for n, t in trainer.named_weights().items()}
    trainer.optimizer_step()
    optimizer.step()
    assert trainer.optimizer is not None
    assert sum(s["exp_avg"].numel() for s in trainer.optimizer.state.values()) == trainer.flat_params.numel()
    after = trainer.named_weights()
    worst = max(float((after[n] - p.detach()).abs().max()) for n, p in lora.items())
    assert worst <= 1e-6, worst
    moved = max(float((after[n] - before[n]).abs().max()) for n in lora)
    assert moved > 5e-6, "the step must move the adapter (by about lr) for the comparison to mean something"


def test_checkpoint_carries_adapter_and_optimizer_and_publication_loads_in_peft(tmp_path: Path) -> None:
    trainer = _trainer("qwen3", checkpoint_dir=tmp_path / "ckpt")
    _trained_b(trainer, 2)
    trainer.accumulate(_step(trainer))
    trainer.optimizer_step()
    path = trainer.save_checkpoint(tmp_path / "ckpt")
    assert latest_checkpoint(tmp_path / "ckpt") == path and (path / WEIGHTS_FILE).is_file()
    assert (path / "optimizer.pt").is_file() and not (path / "model.safetensors").exists()

    fresh = _trainer("qwen3")
    fresh.load_checkpoint(path)
    assert fresh.version == 1 and fresh.digest() == trainer.digest()
    assert fresh.optimizer is not None and trainer.optimizer is not None
    ours, theirs = fresh.optimizer.state_dict()["state"], trainer.optimizer.state_dict()["state"]
    assert all(torch.equal(ours[k]["exp_avg_sq"], theirs[k]["exp_avg_sq"]) for k in theirs)

    adapter = trainer.adapter
    assert adapter is not None
    published = write_published(
        tmp_path / "ckpt", version=1, arch=trainer.arch, tensors={}, source=hf_dir("qwen3"), adapter=adapter
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir("qwen3"), dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(hf, str(published)).eval()
    ids = torch.arange(100, 164)
    with torch.no_grad():
        ref = model(input_ids=ids[None]).logits[0]
        got = trainer.logits(ids, torch.arange(64), torch.tensor([0, 64]), None)
    assert float((got - ref).abs().max()) <= 1e-5
