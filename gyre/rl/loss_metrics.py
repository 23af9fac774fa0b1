"""`LossMetrics`: the additive statistics of a loss evaluation (`gyre.rl.loss`), kept apart from the loss
so that what a cell reports (the clip and mask fractions, the importance ratios, the train/inference
mismatch) reads in one place.

Every field is a sum, a count, a min or a max, so the metrics of several micro-steps or cells merge
exactly (`merge`: means weighted by their token and execution counts, max of maxes); `summary()` turns
them into the fractions and means a step reports.

    merged = LossMetrics().merge(a).merge(b)
    merged.summary()["mismatch_kl_token_mean"]
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class LossMetrics:
    """Additive statistics of one loss evaluation; merge across micro-steps and cells."""

    loss: float = 0.0
    """Σ c_u · ℓ_u of the targets seen."""
    num_targets: int = 0
    num_clipped_tokens: int = 0
    """Targets of executions whose mask m_i is 0."""
    num_ratio_capped_tokens: int = 0
    """Targets whose token ratio ρ_u exceeded the cap (weight capped)."""
    num_loss_capped_tokens: int = 0
    """Targets whose loss hit the loss cap (no gradient from them)."""
    token_ratio_sum: float = 0.0
    token_ratio_min: float = math.inf
    token_ratio_max: float = -math.inf
    token_kl_sum: float = 0.0
    """Σ (ρ_u − 1 − log ρ_u): the k3 estimate of KL(behaviour ‖ current policy), summed over targets."""
    num_executions: int = 0
    """Executions with at least one target."""
    num_clipped_executions: int = 0
    seq_ratio_sum: float = 0.0
    seq_ratio_min: float = math.inf
    seq_ratio_max: float = -math.inf
    num_token_masked_tokens: int = 0
    """Targets dropped by the token correction's band (`mis`, `icepop`)."""
    num_unscored_executions: int = 0
    """Executions whose every target the token correction dropped: no sequence ratio, clip or sequence-mask
    decision (0 under `tis`)."""
    num_sequence_masked_executions: int = 0
    """Executions dropped by the sequence (geometric-mean) mask."""
    num_sequence_masked_tokens: int = 0
    """Targets of those executions."""
    num_mismatch_targets: int = 0
    """Targets sampled at the trainer's own weight version (`on_policy`): the mismatch is measured on them
    alone, where π_θ and p_roll differ by the engine/trainer numerics only, not by policy drift."""
    mismatch_abs_sum: float = 0.0
    """Σ |log π_θ − log p_roll| over those targets."""
    mismatch_abs_max: float = 0.0
    mismatch_kl_sum: float = 0.0
    """Σ k3 = ρ_u − 1 − log ρ_u over those targets."""
    num_mismatch_over_bound: int = 0
    """Those targets with |log π_θ − log p_roll| above `ObjectiveParams.mismatch_bound`."""
    num_mismatch_executions: int = 0
    """Executions with at least one such target."""

    def merge(self, other: LossMetrics) -> LossMetrics:
        """The metrics of both evaluations together (executions must not be split between them)."""
        return LossMetrics(
            loss=self.loss + other.loss,
            num_targets=self.num_targets + other.num_targets,
            num_clipped_tokens=self.num_clipped_tokens + other.num_clipped_tokens,
            num_ratio_capped_tokens=self.num_ratio_capped_tokens + other.num_ratio_capped_tokens,
            num_loss_capped_tokens=self.num_loss_capped_tokens + other.num_loss_capped_tokens,
            token_ratio_sum=self.token_ratio_sum + other.token_ratio_sum,
            token_ratio_min=min(self.token_ratio_min, other.token_ratio_min),
            token_ratio_max=max(self.token_ratio_max, other.token_ratio_max),
            token_kl_sum=self.token_kl_sum + other.token_kl_sum,
            num_executions=self.num_executions + other.num_executions,
            num_clipped_executions=self.num_clipped_executions + other.num_clipped_executions,
            seq_ratio_sum=self.seq_ratio_sum + other.seq_ratio_sum,
            seq_ratio_min=min(self.seq_ratio_min, other.seq_ratio_min),
            seq_ratio_max=max(self.seq_ratio_max, other.seq_ratio_max),
            num_token_masked_tokens=self.num_token_masked_tokens + other.num_token_masked_tokens,
            num_unscored_executions=self.num_unscored_executions + other.num_unscored_executions,
            num_sequence_masked_executions=self.num_sequence_masked_executions
            + other.num_sequence_masked_executions,
            num_sequence_masked_tokens=self.num_sequence_masked_tokens + other.num_sequence_masked_tokens,
            num_mismatch_targets=self.num_mismatch_targets + other.num_mismatch_targets,
            mismatch_abs_sum=self.mismatch_abs_sum + other.mismatch_abs_sum,
            mismatch_abs_max=max(self.mismatch_abs_max, other.mismatch_abs_max),
            mismatch_kl_sum=self.mismatch_kl_sum + other.mismatch_kl_sum,
            num_mismatch_over_bound=self.num_mismatch_over_bound + other.num_mismatch_over_bound,
            num_mismatch_executions=self.num_mismatch_executions + other.num_mismatch_executions,
        )

    @property
    def num_scored_executions(self) -> int:
        """Executions with a sequence ratio: those with a target the token correction kept."""
        return self.num_executions - self.num_unscored_executions

    @property
    def token_ratio_mean(self) -> float:
        """Σρ_u / targets, held inside [min, max]: the float sum of many equal ratios can round one ulp past them."""
        return _mean_within(
            self.token_ratio_sum, self.num_targets, self.token_ratio_min, self.token_ratio_max
        )

    @property
    def seq_ratio_mean(self) -> float:
        """Σs_i / scored executions, held inside [min, max] like `token_ratio_mean`."""
        return _mean_within(
            self.seq_ratio_sum, self.num_scored_executions, self.seq_ratio_min, self.seq_ratio_max
        )

    def summary(self) -> dict[str, float]:
        """Fractions and means for logs (NaN where nothing was seen)."""
        nan = math.nan
        t, e = self.num_targets, self.num_executions
        m, me = self.num_mismatch_targets, self.num_mismatch_executions
        return {
            "loss": self.loss,
            "num_targets": float(t),
            "num_executions": float(e),
            "clip_fraction_executions": self.num_clipped_executions / e if e else nan,
            "clip_fraction_tokens": self.num_clipped_tokens / t if t else nan,
            "seq_ratio_mean": self.seq_ratio_mean,
            "seq_ratio_min": self.seq_ratio_min if self.num_scored_executions else nan,
            "seq_ratio_max": self.seq_ratio_max if self.num_scored_executions else nan,
            "token_ratio_mean": self.token_ratio_mean,
            "token_ratio_min": self.token_ratio_min if t else nan,
            "token_ratio_max": self.token_ratio_max if t else nan,
            "token_kl_mean": self.token_kl_sum / t if t else nan,
            "num_ratio_capped_tokens": float(self.num_ratio_capped_tokens),
            "num_loss_capped_tokens": float(self.num_loss_capped_tokens),
            "token_mask_fraction": self.num_token_masked_tokens / t if t else nan,
            "sequence_mask_fraction_executions": self.num_sequence_masked_executions / e if e else nan,
            "sequence_mask_fraction_tokens": self.num_sequence_masked_tokens / t if t else nan,
            "mismatch_target_fraction": self.num_mismatch_targets / t if t else nan,
            "mismatch_abs_log_ratio_mean": self.mismatch_abs_sum / m if m else nan,
            "mismatch_abs_log_ratio_max": self.mismatch_abs_max if m else nan,
            "mismatch_kl_token_mean": self.mismatch_kl_sum / m if m else nan,
            "mismatch_kl_execution_mean": self.mismatch_kl_sum / me if me else nan,
            "mismatch_over_bound_fraction": self.num_mismatch_over_bound / m if m else nan,
        }


def _mean_within(total: float, count: int, low: float, high: float) -> float:
    """total / count clamped to [low, high] (the true mean lies there; only rounding leaves it); NaN for no items."""
    return min(max(total / count, low), high) if count else math.nan
