"""The GSPO-variant loss with token-level importance correction (paper Eqs. 5–6; docs/design.md
"Objective"), written over flat per-target tensors so it is blind to how targets were packed.

For target u of execution i (Â_i its advantage, c_u its coefficient 1/(L_i·B·N)):

    ρ_u   = exp(log π_θ(y_u|c_u) − log p_u^roll)           token ratio (behaviour prob is recorded)
    s_i   = sg(exp(mean_{u∈T_i} log ρ_u))                  sequence ratio, no gradient
    m_i   = 0 if (Â_i > 0 and s_i > clip_high) or (Â_i < 0 and s_i < clip_low) else 1
    w_u   = sg(min(ρ_u, token_ratio_cap))
    ℓ_u   = min(token_loss_cap, −m_i · w_u · Â_i · log π_θ(y_u|c_u))
    loss  = Σ_u c_u · ℓ_u

The clip test runs in log space (log s_i against log clip_high / log clip_low): the same decision,
without the rounding of exp, so a sequence ratio exactly at a bound keeps its mask at 1.

s_i needs every target of the execution. The caller either passes all of them (the packer keeps an
execution's rows in one micro-step) or passes `log_seq_ratio` computed beforehand over all of them
(the chunked path of `gyre.rl.step_loss`). Metrics are sums and counts, so the metrics of several
micro-steps or cells merge exactly (`LossMetrics.merge`); `summary()` turns them into fractions.

    objective = ObjectiveParams(**config.objective.model_dump())
    loss, metrics = gspo_loss(logprobs, behaviour, advantages, execution_index, coefficients,
                              objective=objective)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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
        )

    @property
    def token_ratio_mean(self) -> float:
        """Σρ_u / targets, held inside [min, max]: the float sum of many equal ratios can round one ulp past them."""
        return _mean_within(
            self.token_ratio_sum, self.num_targets, self.token_ratio_min, self.token_ratio_max
        )

    @property
    def seq_ratio_mean(self) -> float:
        """Σs_i / executions, held inside [min, max] like `token_ratio_mean`."""
        return _mean_within(self.seq_ratio_sum, self.num_executions, self.seq_ratio_min, self.seq_ratio_max)

    def summary(self) -> dict[str, float]:
        """Fractions and means for logs (NaN where nothing was seen)."""
        nan = math.nan
        t, e = self.num_targets, self.num_executions
        return {
            "loss": self.loss,
            "num_targets": float(t),
            "num_executions": float(e),
            "clip_fraction_executions": self.num_clipped_executions / e if e else nan,
            "clip_fraction_tokens": self.num_clipped_tokens / t if t else nan,
            "seq_ratio_mean": self.seq_ratio_mean,
            "seq_ratio_min": self.seq_ratio_min if e else nan,
            "seq_ratio_max": self.seq_ratio_max if e else nan,
            "token_ratio_mean": self.token_ratio_mean,
            "token_ratio_min": self.token_ratio_min if t else nan,
            "token_ratio_max": self.token_ratio_max if t else nan,
            "token_kl_mean": self.token_kl_sum / t if t else nan,
            "num_ratio_capped_tokens": float(self.num_ratio_capped_tokens),
            "num_loss_capped_tokens": float(self.num_loss_capped_tokens),
        }


def _mean_within(total: float, count: int, low: float, high: float) -> float:
    """total / count clamped to [low, high] (the true mean lies there; only rounding leaves it); NaN for no items."""
    return min(max(total / count, low), high) if count else math.nan


@dataclass(slots=True, frozen=True)
class ObjectiveParams:
    """The objective's knobs; build it from the config section: `ObjectiveParams(**cfg.objective.model_dump())`."""

    clip_low: float = 0.995
    """An execution with Â_i < 0 and s_i below this is masked."""
    clip_high: float = 1.005
    """An execution with Â_i > 0 and s_i above this is masked."""
    token_ratio_cap: float = 5.0
    """Cap of the stop-gradient token weight min(ρ_u, cap)."""
    token_loss_cap: float = 100.0
    """Cap of a token's loss."""

    def __post_init__(self) -> None:
        if not 0.0 < self.clip_low <= 1.0 <= self.clip_high:
            raise ValueError(
                f"need 0 < clip_low <= 1 <= clip_high; got clip_low={self.clip_low}, clip_high={self.clip_high}"
            )
        if not self.token_ratio_cap > 0.0:
            raise ValueError(f"token_ratio_cap must be > 0; got {self.token_ratio_cap}")
        if not self.token_loss_cap > 0.0:
            raise ValueError(f"token_loss_cap must be > 0; got {self.token_loss_cap}")


DEFAULT_OBJECTIVE = ObjectiveParams()


def execution_log_seq_ratios(
    log_ratio: torch.Tensor, execution_index: torch.Tensor, num_executions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log s_i, L_i seen) per execution from per-target log ρ, without gradient; log s_i = 0 where L_i = 0.

    Accumulated in float64 whatever the training dtype, so the clip decision near a bound does not
    depend on how many tokens or chunks were summed.
    """
    with torch.no_grad():
        sums = torch.zeros(num_executions, dtype=torch.float64, device=log_ratio.device)
        sums.index_add_(0, execution_index, log_ratio.detach().double())
        counts = torch.zeros(num_executions, dtype=torch.int64, device=log_ratio.device)
        counts.index_add_(0, execution_index, torch.ones_like(execution_index))
        return sums / counts.clamp(min=1).to(sums.dtype), counts


def clip_mask(
    advantages: torch.Tensor, log_seq_ratio: torch.Tensor, objective: ObjectiveParams
) -> torch.Tensor:
    """m_i as a bool tensor: False where the execution is clipped (see the module docstring)."""
    over = (advantages > 0) & (log_seq_ratio > math.log(objective.clip_high))
    under = (advantages < 0) & (log_seq_ratio < math.log(objective.clip_low))
    return ~(over | under)


def sequence_metrics(
    advantages: torch.Tensor,
    log_seq_ratio: torch.Tensor,
    num_targets: torch.Tensor,
    objective: ObjectiveParams,
) -> LossMetrics:
    """The execution-level fields of `LossMetrics` (executions with num_targets > 0 only)."""
    with torch.no_grad():
        present = num_targets > 0
        keep = clip_mask(advantages, log_seq_ratio, objective)
        seq_ratio = torch.exp(log_seq_ratio[present].double())
        inf = torch.tensor(math.inf, dtype=torch.float64, device=seq_ratio.device)
        stats = torch.stack(
            [
                present.sum().double(),
                (present & ~keep).sum().double(),
                seq_ratio.sum(),
                seq_ratio.min() if seq_ratio.numel() else inf,
                seq_ratio.max() if seq_ratio.numel() else -inf,
            ]
        ).tolist()
    return LossMetrics(
        num_executions=int(stats[0]),
        num_clipped_executions=int(stats[1]),
        seq_ratio_sum=stats[2],
        seq_ratio_min=stats[3],
        seq_ratio_max=stats[4],
    )


def gspo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    execution_index: torch.Tensor,
    coefficients: torch.Tensor,
    *,
    objective: ObjectiveParams = DEFAULT_OBJECTIVE,
    log_seq_ratio: torch.Tensor | None = None,
    execution_metrics: bool = True,
) -> tuple[torch.Tensor, LossMetrics]:
    """The loss Σ c_u·ℓ_u over the given targets and its metrics.

    Per target [U]: `logprobs` (with gradient), `behaviour_logprobs`, `execution_index` (into
    `advantages` [E]) and `coefficients`. `log_seq_ratio` [E], when given, replaces the log s_i
    computed from these targets (it must then cover every target of each execution). With
    `execution_metrics=False` the execution-level metric fields stay empty (the caller fills them
    once, e.g. when one execution is evaluated in several chunks).
    """
    num_targets = logprobs.shape[0]
    if not (behaviour_logprobs.shape[0] == execution_index.shape[0] == coefficients.shape[0] == num_targets):
        raise ValueError(
            "logprobs, behaviour_logprobs, execution_index and coefficients need one entry per target"
        )
    num_executions = advantages.shape[0]
    execution_index = execution_index.long()
    dtype = logprobs.dtype
    advantages = advantages.to(dtype)

    log_ratio = logprobs.detach() - behaviour_logprobs.to(dtype)
    local_log_s, counts = execution_log_seq_ratios(log_ratio, execution_index, num_executions)
    if log_seq_ratio is None:
        log_s = local_log_s
    else:
        if log_seq_ratio.shape[0] != num_executions:
            raise ValueError(f"log_seq_ratio needs one entry per execution ({num_executions})")
        log_s = log_seq_ratio.detach().double()
    keep = clip_mask(advantages, log_s, objective)

    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(max=objective.token_ratio_cap)
    token_keep = keep[execution_index]
    raw = -(token_keep.to(dtype) * weight * advantages[execution_index]) * logprobs
    token_loss = raw.clamp(max=objective.token_loss_cap)
    loss = (coefficients.to(dtype) * token_loss).sum()

    with torch.no_grad():
        ratio64 = ratio.double()
        inf = torch.tensor(math.inf, dtype=torch.float64, device=loss.device)
        stats = torch.stack(
            [
                loss.detach().double(),
                (~token_keep).sum().double(),
                (ratio > objective.token_ratio_cap).sum().double(),
                (raw.detach() > objective.token_loss_cap).sum().double(),
                ratio64.sum(),
                ratio64.min() if num_targets else inf,
                ratio64.max() if num_targets else -inf,
                (ratio64 - 1.0 - log_ratio.double()).sum(),
            ]
        ).tolist()
    metrics = LossMetrics(
        loss=stats[0],
        num_targets=num_targets,
        num_clipped_tokens=int(stats[1]),
        num_ratio_capped_tokens=int(stats[2]),
        num_loss_capped_tokens=int(stats[3]),
        token_ratio_sum=stats[4],
        token_ratio_min=stats[5],
        token_ratio_max=stats[6],
        token_kl_sum=stats[7],
    )
    if execution_metrics:
        metrics = metrics.merge(sequence_metrics(advantages, log_s, counts, objective))
    return loss, metrics
