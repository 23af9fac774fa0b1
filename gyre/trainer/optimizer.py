"""The core's optimizer pieces: AdamW with a constant learning rate, and the global-norm clip of the
summed gradient (applied to the flat gradient buffer in one pass).

The clip is torch's `clip_grad_norm_` rule on one buffer: coefficient min(1, max_norm / (norm + 1e-6)).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from gyre.config.training import TrainerSection

CLIP_EPS = 1e-6


def build_adamw(params: Iterable[torch.nn.Parameter], section: TrainerSection) -> torch.optim.AdamW:
    """AdamW from the trainer section (constant lr: no schedule)."""
    return torch.optim.AdamW(
        params,
        lr=section.lr,
        betas=(section.adam_beta1, section.adam_beta2),
        eps=section.adam_eps,
        weight_decay=section.weight_decay,
    )


def clip_flat_grads(grads: torch.Tensor, max_norm: float) -> float:
    """Scale `grads` in place so its L2 norm is at most `max_norm` (0 = no clip); returns the norm before."""
    norm = torch.linalg.vector_norm(grads, 2.0)
    if max_norm > 0:
        coefficient = torch.clamp(max_norm / (norm + CLIP_EPS), max=1.0)
        grads.mul_(coefficient.to(grads.dtype))
    return float(norm)
