"""Tiny real transformers models (Qwen3 tied, Llama untied, Qwen2 with q/k/v biases) with every weight
randomized (norms around 1, biases non-zero), and the reference computations on them: per-row
log-probs and one Gyre-objective AdamW step, both with the transformers model itself."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import torch
import transformers

from gyre.rl.loss import ObjectiveParams
from gyre.rl.microstep import MicroStep
from gyre.rl.step_loss import train_microstep

VOCAB = 512
_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
FAMILIES: dict[str, tuple[type[Any], type[Any], dict[str, Any]]] = {
    "qwen3": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(
            head_dim=16, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
        ),
    ),
    "llama": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
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
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
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
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
    ),
}


def hf_model(family: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> Any:
    """A randomized tiny model of `family` (same seed → same weights in any process)."""
    config_cls, model_cls, extra = FAMILIES[family]
    config = config_cls(**{**_COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
    return model.to(dtype).eval()


def hf_tensors(model: Any) -> dict[str, torch.Tensor]:
    """HF-named tensors as a checkpoint has them (no tied lm_head)."""
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    return tensors


def row_logprobs_fn(model: Any) -> Any:
    def row_logprobs(tokens: np.ndarray) -> np.ndarray:
        ids = torch.as_tensor(tokens, dtype=torch.int64)
        with torch.no_grad():
            logits = model(ids[None]).logits[0].double()
        lp = torch.log_softmax(logits, dim=-1)[:-1].gather(1, ids[1:, None]).squeeze(1)
        return np.concatenate([[0.0], lp.numpy()])

    return row_logprobs


def hf_packed_logits(
    model: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, cu: torch.Tensor
) -> torch.Tensor:
    """The packed logits contract computed the plain way: each row alone through the HF model."""
    bounds = cu.tolist()
    return torch.cat([model(input_ids[a:b][None]).logits[0] for a, b in pairwise(bounds)])


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
        train_microstep(s, lambda i, p, c: hf_packed_logits(model, i, p, c), objective=objective)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=adam_eps, weight_decay=0.0).step()
    return float(norm)
