"""Tiny HF model directories of every family the megatron backend builds (Qwen3 tied, Llama untied with
llama3 rope, Qwen3 with YaRN, Qwen2 with q/k/v biases), every weight randomized (norms around 1, biases
non-zero), made by `gyre model init` and kept for the session; and the references computed on them
with the real transformers model: per-row log-probs and one Gyre-objective AdamW step."""

from __future__ import annotations

import functools
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
import transformers

from gyre.model.causal_lm import CausalLM
from gyre.model.files import check_model_dir
from gyre.model.init import init_model_dir
from gyre.model.weights import load_model, load_state_dict, write_model_dir
from gyre.rl.loss import ObjectiveParams
from gyre.rl.microstep import MicroStep
from gyre.rl.step_loss import train_microstep
from gyre.trainer.synthetic import synthetic_microsteps
from tests.support.models import _ROOT

DIMS: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": (
        "qwen3",
        dict(
            head_dim=16, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
        ),
    ),
    "llama": (
        "llama",
        dict(
            head_dim=16,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 5e5,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "qwen3_yarn": (
        "qwen3",
        dict(
            head_dim=16,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1e6,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    "qwen2": (
        "qwen2",
        dict(
            head_dim=16,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        ),
    ),
}


@functools.cache
def family_dir(family: str, **overrides: Any) -> Path:
    """An HF directory of `family` (1024-token BPE vocabulary) with randomized weights."""
    arch, extra = FAMILIES[family]
    name = family + "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
    out = init_model_dir(
        _ROOT / f"megatron-{name}-init", arch=arch, vocab_size=1024, overrides={**DIMS, **extra, **overrides}
    )
    info = check_model_dir(out)
    generator = torch.Generator().manual_seed(0)
    tensors = {
        n: torch.randn(t.shape, generator=generator) * 0.1 + (1.0 if "norm" in n else 0.0)
        for n, t in load_state_dict(info).items()
    }
    return write_model_dir(_ROOT / f"megatron-{name}", arch=info.arch, tensors=tensors, source=out)


def hf_reference(directory: Path) -> Any:
    """The transformers model of a directory (float32, eval)."""
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def batch(
    directory: Path, *, seed: int = 3, token_budget: int = 160, max_row_tokens: int = 48
) -> list[MicroStep]:
    """A synthetic batch (path rows) whose behaviour log-probs are the model's own plus noise."""
    model: CausalLM = load_model(directory)
    return synthetic_microsteps(
        model,
        batch_id="b0",
        step=0,
        num_groups=2,
        group_size=3,
        token_budget=token_budget,
        min_row_tokens=8,
        max_row_tokens=max_row_tokens,
        seed=seed,
    )


def hf_packed_logits(model: Any, input_ids: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """The packed logits contract computed the plain way: each row alone through the HF model."""
    return torch.cat([model(input_ids[a:b][None]).logits[0] for a, b in pairwise(cu.tolist())])


def hf_reference_step(
    model: Any,
    steps: list[MicroStep],
    *,
    lr: float,
    adam_eps: float,
    grad_clip: float,
    objective: ObjectiveParams,
) -> float:
    """Accumulate `steps` with the Gyre objective, clip (torch's rule), one AdamW step; returns the norm."""
    model.train()
    for s in steps:
        assert s.tree is None, "the reference runs path rows"
        train_microstep(s, lambda i, p, c, _tree: hf_packed_logits(model, i, c), objective=objective)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=adam_eps, weight_decay=0.0).step()
    return float(norm)


def hf_tensors(model: Any) -> dict[str, torch.Tensor]:
    """HF-named parameters as a checkpoint has them (no tied lm_head)."""
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items() if "rotary" not in k}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    return tensors
