"""The GSPO-variant loss with token-level importance correction (paper Eqs. 5–6; docs/design.md
"Objective"), written over flat per-target tensors so it is blind to how targets were packed.

For target u of execution i (Â_i its advantage, c_u its coefficient 1/(L_i·B·N)):

    ρ_u   = exp(log π_θ(y_u|c_u) − log p_u^roll)           token ratio (behaviour prob is recorded)
    s_i   = sg(exp(mean_{u∈T_i} log ρ_u))                  sequence ratio, no gradient
    m_i   = 0 if (Â_i > 0 and s_i > clip_high) or (Â_i < 0 and s_i < clip_low) else 1
    w_u   = sg(min(ρ_u, token_ratio_cap))
    ℓ_u   = min(token_loss_cap, −m_i · w_u · Â_i · log π_θ(y_u|c_u))
    loss  = Σ_u c_u · ℓ_u

Corrections for the train/inference mismatch (`gyre.rl.corrections`, off by default): `token_correction`
`mis` or `icepop` drops targets whose ρ_u leaves a band (and rescales the kept targets of their execution
to 1/(L'_i·B·N)); `sequence_mask` drops whole executions whose s_i leaves a band. The defaults
(`tis`, no sequence mask) compute exactly the formula above.

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

from gyre.rl.corrections import TOKEN_CORRECTIONS, inside, kept_normalizer_scale, validate_band
from gyre.rl.loss_metrics import LossMetrics as LossMetrics  # re-exported: callers import it from here


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
    token_correction: str = "tis"
    """Token-level mismatch correction, a name in `gyre.rl.corrections.TOKEN_CORRECTIONS`: `tis` (the
    paper's capped weight), `mis` or `icepop` (a band outside which a target is dropped)."""
    mis_low: float = 0.0
    """`mis`: a target with ρ_u below this is dropped (0 = no lower bound)."""
    mis_high: float = 2.0
    """`mis`: a target with ρ_u above this is dropped."""
    icepop_low: float = 0.5
    """`icepop`: a target with ρ_u below this is dropped."""
    icepop_high: float = 5.0
    """`icepop`: a target with ρ_u above this is dropped."""
    sequence_mask: bool = False
    """Drop an execution whose geometric-mean ratio s_i leaves [sequence_mask_low, sequence_mask_high]."""
    sequence_mask_low: float = 0.99
    """Lower bound of s_i under `sequence_mask`."""
    sequence_mask_high: float = 1.01
    """Upper bound of s_i under `sequence_mask`."""
    mismatch_bound: float = 0.1
    """|log π_θ − log p_roll| above which a target counts in the mismatch's over-bound fraction."""

    def __post_init__(self) -> None:
        if not 0.0 < self.clip_low <= 1.0 <= self.clip_high:
            raise ValueError(
                f"need 0 < clip_low <= 1 <= clip_high; got clip_low={self.clip_low}, clip_high={self.clip_high}"
            )
        if not self.token_ratio_cap > 0.0:
            raise ValueError(f"token_ratio_cap must be > 0; got {self.token_ratio_cap}")
        if not self.token_loss_cap > 0.0:
            raise ValueError(f"token_loss_cap must be > 0; got {self.token_loss_cap}")
        if self.token_correction not in TOKEN_CORRECTIONS:
            raise ValueError(
                f"token_correction must be one of {', '.join(TOKEN_CORRECTIONS)}; got {self.token_correction!r}"
            )
        validate_band("mis", self.mis_low, self.mis_high, low_may_be_zero=True)
        validate_band("icepop", self.icepop_low, self.icepop_high, low_may_be_zero=False)
        validate_band("sequence_mask", self.sequence_mask_low, self.sequence_mask_high, low_may_be_zero=False)
        if not self.mismatch_bound > 0.0:
            raise ValueError(f"mismatch_bound must be > 0; got {self.mismatch_bound}")

    @property
    def token_band(self) -> tuple[float, float] | None:
        """The [low, high] band of ρ_u outside which a target is dropped; None under `tis`."""
        if self.token_correction == "mis":
            return self.mis_low, self.mis_high
        if self.token_correction == "icepop":
            return self.icepop_low, self.icepop_high
        return None


DEFAULT_OBJECTIVE = ObjectiveParams()


def execution_log_seq_ratios(
    log_ratio: torch.Tensor,
    execution_index: torch.Tensor,
    num_executions: int,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log s_i, L_i seen) per execution from per-target log ρ, without gradient; log s_i = 0 where L_i = 0.

    With `keep` (a token correction's mask) only the kept targets count, in the mean and in L_i.
    Accumulated in float64 whatever the training dtype, so the clip decision near a bound does not
    depend on how many tokens or chunks were summed.
    """
    with torch.no_grad():
        values = log_ratio.detach().double()
        ones = torch.ones_like(execution_index)
        if keep is not None:
            values, ones = values * keep, ones * keep
        sums = torch.zeros(num_executions, dtype=torch.float64, device=log_ratio.device)
        sums.index_add_(0, execution_index, values)
        counts = torch.zeros(num_executions, dtype=torch.int64, device=log_ratio.device)
        counts.index_add_(0, execution_index, ones)
        return sums / counts.clamp(min=1).to(sums.dtype), counts


def clip_mask(
    advantages: torch.Tensor, log_seq_ratio: torch.Tensor, objective: ObjectiveParams
) -> torch.Tensor:
    """m_i as a bool tensor: False where the execution is clipped (see the module docstring)."""
    over = (advantages > 0) & (log_seq_ratio > math.log(objective.clip_high))
    under = (advantages < 0) & (log_seq_ratio < math.log(objective.clip_low))
    return ~(over | under)


def sequence_keep(log_seq_ratio: torch.Tensor, objective: ObjectiveParams) -> torch.Tensor:
    """[E] bool: False where the sequence (geometric-mean) mask drops the execution; all True when it is off."""
    if not objective.sequence_mask:
        return torch.ones_like(log_seq_ratio, dtype=torch.bool)
    return inside(log_seq_ratio, objective.sequence_mask_low, objective.sequence_mask_high)


def token_keep(log_ratio: torch.Tensor, objective: ObjectiveParams) -> torch.Tensor | None:
    """[U] bool: False where the token correction drops the target; None under `tis` (nothing dropped)."""
    band = objective.token_band
    return None if band is None else inside(log_ratio.detach(), *band)


def sequence_metrics(
    advantages: torch.Tensor,
    log_seq_ratio: torch.Tensor,
    num_targets: torch.Tensor,
    objective: ObjectiveParams,
    num_kept: torch.Tensor | None = None,
    num_measured: torch.Tensor | None = None,
) -> LossMetrics:
    """The execution-level fields of `LossMetrics`: executions with num_targets > 0 count; their ratio,
    clip and sequence mask only where the token correction kept a target (`num_kept`, default all); the
    mismatch's executions where a target was sampled at the trainer's version (`num_measured`, default all)."""
    with torch.no_grad():
        present = num_targets > 0
        scored = present if num_kept is None else num_kept > 0
        keep = clip_mask(advantages, log_seq_ratio, objective)
        dropped = scored & ~sequence_keep(log_seq_ratio, objective)
        seq_ratio = torch.exp(log_seq_ratio[scored].double())
        inf = torch.tensor(math.inf, dtype=torch.float64, device=seq_ratio.device)
        stats = torch.stack(
            [
                present.sum().double(),
                (scored & ~keep).sum().double(),
                seq_ratio.sum(),
                seq_ratio.min() if seq_ratio.numel() else inf,
                seq_ratio.max() if seq_ratio.numel() else -inf,
                dropped.sum().double(),
                (present & ~scored).sum().double(),
                (present if num_measured is None else num_measured > 0).sum().double(),
            ]
        ).tolist()
    return LossMetrics(
        num_executions=int(stats[0]),
        num_clipped_executions=int(stats[1]),
        seq_ratio_sum=stats[2],
        seq_ratio_min=stats[3],
        seq_ratio_max=stats[4],
        num_sequence_masked_executions=int(stats[5]),
        num_unscored_executions=int(stats[6]),
        num_mismatch_executions=int(stats[7]),
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
    normalizer_scale: torch.Tensor | None = None,
    on_policy: torch.Tensor | None = None,
    execution_metrics: bool = True,
) -> tuple[torch.Tensor, LossMetrics]:
    """The loss Σ c_u·ℓ_u over the given targets and its metrics.

    Per target [U]: `logprobs` (with gradient), `behaviour_logprobs`, `execution_index` (into
    `advantages` [E]) and `coefficients`. `log_seq_ratio` [E], when given, replaces the log s_i
    computed from these targets, and `normalizer_scale` [E] the L_i / L'_i of a token correction (both
    must then cover every target of each execution: `gyre.rl.corrections`). `on_policy` [U] bool marks
    the targets sampled at the trainer's own weight version, over which the mismatch is measured
    (default: every target). With `execution_metrics=False` the execution-level metric fields stay
    empty (the caller fills them once, e.g. when one execution is evaluated in several chunks).
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
    tokens_kept = token_keep(log_ratio, objective)
    local_log_s, counts = execution_log_seq_ratios(log_ratio, execution_index, num_executions)
    num_kept = None
    if tokens_kept is not None:
        local_log_s, num_kept = execution_log_seq_ratios(
            log_ratio, execution_index, num_executions, tokens_kept
        )
    if log_seq_ratio is None:
        log_s = local_log_s
    else:
        if log_seq_ratio.shape[0] != num_executions:
            raise ValueError(f"log_seq_ratio needs one entry per execution ({num_executions})")
        log_s = log_seq_ratio.detach().double()
    keep = clip_mask(advantages, log_s, objective)
    clip_keep = keep[execution_index]
    seq_keep = sequence_keep(log_s, objective)
    if objective.sequence_mask:
        keep = keep & seq_keep

    ratio = torch.exp(log_ratio)
    weight = ratio if objective.token_correction == "mis" else ratio.clamp(max=objective.token_ratio_cap)
    kept = keep[execution_index]
    if tokens_kept is not None:
        assert num_kept is not None
        kept = kept & tokens_kept
        if normalizer_scale is None:
            normalizer_scale = kept_normalizer_scale(counts, num_kept)
        elif normalizer_scale.shape[0] != num_executions:
            raise ValueError(f"normalizer_scale needs one entry per execution ({num_executions})")
        coefficients = coefficients * normalizer_scale.to(coefficients.dtype)[execution_index]
    raw = -(kept.to(dtype) * weight * advantages[execution_index]) * logprobs
    token_loss = raw.clamp(max=objective.token_loss_cap)
    loss = (coefficients.to(dtype) * token_loss).sum()

    measured = torch.ones_like(execution_index, dtype=torch.bool) if on_policy is None else on_policy.bool()
    if measured.shape[0] != num_targets:
        raise ValueError("on_policy needs one entry per target")
    scored = torch.ones_like(clip_keep) if tokens_kept is None else tokens_kept
    masks = (scored & ~clip_keep, scored & ~seq_keep[execution_index], ~scored)
    metrics = _token_metrics(loss, log_ratio, ratio, raw, measured, masks, objective)
    if execution_metrics:
        num_measured = torch.zeros_like(counts).index_add_(0, execution_index, measured.long())
        metrics = metrics.merge(
            sequence_metrics(advantages, log_s, counts, objective, num_kept, num_measured)
        )
    return loss, metrics


def _token_metrics(
    loss: torch.Tensor,
    log_ratio: torch.Tensor,
    ratio: torch.Tensor,
    raw: torch.Tensor,
    measured: torch.Tensor,
    masks: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    objective: ObjectiveParams,
) -> LossMetrics:
    """The per-target fields of `LossMetrics` in one device sync: the mismatch over the `measured` targets,
    the targets of each mask (clipped, sequence-masked, token-masked) as counts."""
    num_targets = log_ratio.shape[0]
    capped = objective.token_correction != "mis"
    with torch.no_grad():
        ratio64 = ratio.double()
        abs_log = log_ratio.double().abs()[measured]
        kl = ratio64 - 1.0 - log_ratio.double()
        inf = torch.tensor(math.inf, dtype=torch.float64, device=loss.device)
        stats = torch.stack(
            [
                loss.detach().double(),
                (ratio > objective.token_ratio_cap).sum().double() if capped else torch.zeros_like(inf),
                (raw.detach() > objective.token_loss_cap).sum().double(),
                ratio64.sum(),
                ratio64.min() if num_targets else inf,
                ratio64.max() if num_targets else -inf,
                kl.sum(),
                abs_log.sum(),
                abs_log.max() if abs_log.numel() else torch.zeros_like(inf),
                (abs_log > objective.mismatch_bound).sum().double(),
                measured.sum().double(),
                kl[measured].sum(),
                *(m.sum().double() for m in masks),
            ]
        ).tolist()
    return LossMetrics(
        loss=stats[0],
        num_targets=num_targets,
        num_ratio_capped_tokens=int(stats[1]),
        num_loss_capped_tokens=int(stats[2]),
        token_ratio_sum=stats[3],
        token_ratio_min=stats[4],
        token_ratio_max=stats[5],
        token_kl_sum=stats[6],
        mismatch_abs_sum=stats[7],
        mismatch_abs_max=stats[8],
        num_mismatch_over_bound=int(stats[9]),
        num_mismatch_targets=int(stats[10]),
        mismatch_kl_sum=stats[11],
        num_clipped_tokens=int(stats[12]),
        num_sequence_masked_tokens=int(stats[13]),
        num_token_masked_tokens=int(stats[14]),
    )
