"""Train/inference mismatch corrections of the objective: which targets a token or sequence mask drops,
and how an execution's normalizer follows the targets it keeps (docs/method.md, "Mismatch corrections").

The paper's GSPO variant weighs each target by sg(min(ρ_u, 5)) (token TIS) and keeps every target in
L_i. The corrections here are opt-in (`ObjectiveParams`), each a decision made from the detached log
ratio log ρ_u = log π_θ(y_u|c_u) − log p_u^roll:

- `mis`     masked IS: a target with ρ_u outside [mis_low, mis_high] is dropped, the others are weighted
            by sg(ρ_u) uncapped (masking replaces truncation);
- `icepop`  a band [icepop_low, icepop_high] around 1 outside which a target is dropped; the others keep
            the paper's capped weight sg(min(ρ_u, cap));
- sequence  geometric-mean masking: an execution whose s_i = exp(mean log ρ_u) lies outside
            [sequence_mask_low, sequence_mask_high] is dropped whole, whatever the sign of Â_i.

A target dropped by a token mask leaves its execution's normalizer: the packer gave it the coefficient
1/(L_i·B·N), and the trainer rescales every kept target of execution i by L_i / L'_i (L'_i the kept
count), so a kept target carries 1/(L'_i·B·N). Every target of an execution is in one micro-step (and
the chunked path counts L'_i over all chunks first), so the rescale is local and any split of the
batch into micro-steps and cells still sums to the batch gradient. Bounds are compared in log space,
inclusive: a ratio exactly at a bound is kept.
"""

from __future__ import annotations

import math

import torch

TOKEN_CORRECTIONS = ("tis", "mis", "icepop")
"""The token corrections `ObjectiveParams.token_correction` names (the config's Literal equals it: a test)."""


def log_bound(value: float) -> float:
    """log of a ratio bound; a lower bound of 0 is no bound (−inf)."""
    return math.log(value) if value > 0.0 else -math.inf


def inside(log_values: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """True where exp(log_values) lies in [low, high] (compared in log space, bounds included)."""
    return (log_values >= log_bound(low)) & (log_values <= log_bound(high))


def kept_normalizer_scale(num_targets: torch.Tensor, num_kept: torch.Tensor) -> torch.Tensor:
    """[E] float64 L_i / L'_i from every target's and every kept target's count; 0 where L'_i = 0."""
    with torch.no_grad():
        kept = num_kept.to(torch.float64)
        return torch.where(
            kept > 0, num_targets.to(torch.float64) / kept.clamp(min=1.0), torch.zeros_like(kept)
        )


def validate_band(name: str, low: float, high: float, *, low_may_be_zero: bool) -> None:
    """A mask band must keep ratio 1 (an on-policy token is never dropped)."""
    floor_ok = low >= 0.0 if low_may_be_zero else low > 0.0
    if not (floor_ok and low <= 1.0 <= high and math.isfinite(high)):
        floor = "0 <=" if low_may_be_zero else "0 <"
        raise ValueError(
            f"need {floor} {name}_low <= 1 <= {name}_high < inf; got {name}_low={low}, {name}_high={high}"
        )
