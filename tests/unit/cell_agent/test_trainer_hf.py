"""Acceptance (HF models): the torch trainer's per-token log-probs equal a `transformers` forward, and
one optimizer step on a fixed micro-step equals the same step computed with the `transformers` model
and `torch.optim.AdamW` — for tiny Llama, Qwen2, Qwen3 and Qwen3-MoE made by `gyre model init` (fp32;
transformers 5 holds a MoE layer's experts as two stacked tensors, compared with Gyre's per-expert ones).

The step runs at lr 1e-5 (the paper trains at 1e-6). AdamW's first update is lr·g/(|g|+eps): for
entries whose gradient is near eps, float32 rounding of g (gradients agree to ~1e-6 relative,
asserted below) moves the update by a fraction of lr, so the parameter difference grows linearly
with lr — measured on the tiny Llama: 4.1e-8, 4.1e-7, 4.1e-6, 4.1e-5 at lr 1e-6 … 1e-3."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import transformers

from gyre.config.training import TrainerSection
from gyre.rl.loss import ObjectiveParams
from gyre.rl.step_loss import target_logprobs, train_microstep
from gyre.trainer.backends import TrainerSpec
from gyre.trainer.backends.torch_backend import TorchTrainer
from gyre.trainer.synthetic import synthetic_microsteps
from tests.support.models import hf_dir


def _hf_logits_fn(model: Any) -> Any:
    """The packed-forward contract over a transformers model: each row alone, concatenated."""

    def logits(
        input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor, tree: object = None
    ) -> torch.Tensor:
        assert tree is None, "this reference runs path rows"
        bounds = [int(b) for b in cu_seqlens.tolist()]
        rows = [model(input_ids[a:b][None]).logits[0] for a, b in itertools.pairwise(bounds)]
        return torch.cat(rows)

    return logits


def _as_transformers(named: dict[str, torch.Tensor], hf_names: list[str]) -> dict[str, torch.Tensor]:
    """Gyre's per-expert tensors stacked as transformers 5 holds them (`experts.gate_up_proj` [E, 2I, d],
    `experts.down_proj` [E, d, I]); every other name as it is."""
    out: dict[str, torch.Tensor] = {}
    for name in hf_names:
        prefix, _, leaf = name.rpartition("experts.")
        if not prefix:
            out[name] = named[name]
            continue
        count = 1 + max(
            int(n[len(prefix) + 8 :].split(".")[0]) for n in named if n.startswith(prefix + "experts.")
        )
        if leaf == "gate_up_proj":
            out[name] = torch.stack(
                [
                    torch.cat([named[f"{prefix}experts.{e}.{p}.weight"] for p in ("gate_proj", "up_proj")])
                    for e in range(count)
                ]
            )
        else:
            out[name] = torch.stack([named[f"{prefix}experts.{e}.down_proj.weight"] for e in range(count)])
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "qwen3_moe"])
def test_logprobs_and_one_step_equal_transformers_with_adamw(arch: str) -> None:
    section = TrainerSection(lr=1e-5, weight_decay=0.01, grad_clip=0.0)
    trainer = TorchTrainer.create(TrainerSpec(section, hf_dir(arch), ObjectiveParams(), with_optimizer=True))
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir(arch), dtype=torch.float32)
    hf.train()
    step = synthetic_microsteps(
        trainer.model,
        batch_id="b",
        step=0,
        num_groups=2,
        group_size=3,
        token_budget=2048,
        max_row_tokens=120,
        seed=7,
    )[0]
    ids = torch.as_tensor(step.input_ids, dtype=torch.int64)
    targets = torch.as_tensor(step.target_mask.nonzero()[0], dtype=torch.int64)
    cu = torch.as_tensor(step.cu_seqlens)
    with torch.no_grad():
        ours = target_logprobs(
            trainer.model(ids, torch.as_tensor(step.position_ids, dtype=torch.int64), cu), ids, targets
        )
        theirs = target_logprobs(_hf_logits_fn(hf)(ids, ids, cu), ids, targets)
    assert len(targets) > 50 and (ours - theirs).abs().max().item() <= 1e-5

    optimizer = torch.optim.AdamW(hf.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    trainer.accumulate(step)
    train_microstep(step, _hf_logits_fn(hf), objective=ObjectiveParams())
    hf_names = [n for n, _ in hf.named_parameters()]
    grads = _as_transformers({n: p.grad for n, p in trainer.model.named_parameters()}, hf_names)
    for name, p in hf.named_parameters():
        assert p.grad is not None and float(p.grad.abs().max()) > 0, name
        assert float((grads[name] - p.grad).abs().max()) <= 1e-5 * float(p.grad.abs().max()), name
    trainer.optimizer_step()
    optimizer.step()
    ours_after = _as_transformers(trainer.named_weights(), hf_names)
    worst = max(float((ours_after[n] - p.detach()).abs().max()) for n, p in hf.named_parameters())
    assert worst <= 1e-6, worst
    moved = max(
        float((ours_after[n] - p.detach()).abs().max())
        for n, p in transformers.AutoModelForCausalLM.from_pretrained(
            hf_dir(arch), dtype=torch.float32
        ).named_parameters()
    )
    assert moved > 5e-6, "the step must move the weights (by about lr) for the comparison to mean something"
