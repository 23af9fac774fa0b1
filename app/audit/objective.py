"""The audit's own implementation of the training objective: the GSPO variant of docs/method.md (Eqs. 5–6)
with the run's mismatch corrections, written from the formulas and independent of the trainer's loss code
(`gyre/rl/loss.py`, `corrections.py`, `step_loss.py`: none of them is imported here, directly or not; a
unit test checks it), so that a trainer whose loss is wrong cannot replay "exactly" and pass.

    spec = ObjectiveSpec.of(config.objective)
    loss = microstep_objective(microstep, trainer.logits, spec, chunk_tokens=budget)   # then backward

For the targets u of execution i (advantage Â_i, coefficient c_u = 1/(L_i·B·N) as packed):

    log ρ_u = log π_θ(y_u) − log p_u^roll                      (no gradient through the ratio)
    keep_u  = ρ_u within the token band ([mis_low, mis_high] or [icepop_low, icepop_high]; always under tis)
    L'_i    = |{u ∈ T_i : keep_u}|,   log s_i = mean of log ρ_u over the kept targets (0 if none)
    m_i     = 0 if (Â_i > 0 and s_i > clip_high) or (Â_i < 0 and s_i < clip_low), and 0 outside
              [sequence_mask_low, sequence_mask_high] under sequence_mask; else 1
    w_u     = ρ_u under mis, min(ρ_u, token_ratio_cap) otherwise
    ℓ_u     = min(token_loss_cap, −m_i · keep_u · w_u · Â_i · log π_θ(y_u))
    loss    = Σ_u c_u · (L_i / L'_i) · ℓ_u                      (L_i / L'_i = 1 under tis)

Every bound is compared in log space and includes its end (a ratio exactly at a bound is kept); a lower
band bound of 0 is no bound. The ratio, the masks and the weights are computed in float64, the loss too.

**How the audit uses it** (`gradients.py`): at every replayed step, before its optimizer step, each
micro-step's gradient is taken twice on the trainer's model at the replayed weights (a float64 copy of the
run's trainer) — once by the trainer's own `accumulate`, once by backward of this loss over the same
forward (the trainer's `logits`, the same row chunks) — and the two must agree within the replay's
tolerance. A loss with one coefficient changed moves the gradient by far more (1 % off: 1e-2 against
1e-6). Why the gradient and not the loss value: the trainer reports no per-micro-step loss, and the
gradient is what reaches the weights. Why not replay with this objective instead: the replay's bit-exact
weights need the trainer's own arithmetic; comparing per micro-step keeps that, and names the micro-step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from gyre.rl.microstep import MicroStep, row_chunks

LogitsFn = Callable[..., torch.Tensor]
"""`logits_fn(input_ids, position_ids, cu_seqlens, tree[, routed_experts])`: the trainer's packed forward."""


class TargetsObserver(Protocol):
    """What sees every target's log ratio of a micro-step (`corrections.StepCorrections`)."""

    def add(
        self, log_ratio: torch.Tensor, execution_index: torch.Tensor, advantages: torch.Tensor
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class ObjectiveSpec:
    """The objective's constants, from the run's `objective` config section."""

    clip_low: float = 0.995
    clip_high: float = 1.005
    token_ratio_cap: float = 5.0
    token_loss_cap: float = 100.0
    token_correction: str = "tis"
    mis_low: float = 0.0
    mis_high: float = 2.0
    icepop_low: float = 0.5
    icepop_high: float = 5.0
    sequence_mask: bool = False
    sequence_mask_low: float = 0.99
    sequence_mask_high: float = 1.01

    @classmethod
    def of(cls, section: Any) -> ObjectiveSpec:
        """From the config's `objective` section (its other fields, metrics bounds, are not the loss's)."""
        return cls(**{name: getattr(section, name) for name in cls.__dataclass_fields__})

    def __post_init__(self) -> None:
        if self.token_correction not in ("tis", "mis", "icepop"):
            raise ValueError(
                f"objective.token_correction {self.token_correction!r} is not tis, mis or icepop"
            )


@dataclass(slots=True)
class Mismatch:
    """The train/inference mismatch of one step from primary data: the audit's log-probs of the targets
    sampled at the weights the step trains (on-policy: their recorded behaviour version is the step's)
    against the log-probs the engine recorded when it sampled them. d_u = log π_θ(y_u) − log p_u^roll;
    k3 = e^d − 1 − d (the estimate of KL(behaviour ‖ policy) the trainer logs)."""

    tokens: int = 0
    abs_sum: float = 0.0
    abs_max: float = 0.0
    k3_sum: float = 0.0

    def add(self, logprobs: torch.Tensor, behaviour: torch.Tensor) -> None:
        d = logprobs.double() - behaviour.double()
        if d.numel() == 0:
            return
        self.tokens += d.numel()
        self.abs_sum += float(d.abs().sum())
        self.abs_max = max(self.abs_max, float(d.abs().max()))
        self.k3_sum += float((torch.expm1(d) - d).sum())

    def to_json(self) -> dict[str, Any]:
        n = self.tokens
        return {
            "tokens": n,
            "mean_abs": self.abs_sum / n if n else None,
            "max_abs": self.abs_max if n else None,
            "k3_kl_token_mean": self.k3_sum / n if n else None,
        }


def _within(log_values: torch.Tensor, low: float, high: float) -> torch.Tensor:
    lower = math.log(low) if low > 0 else -math.inf
    return (log_values >= lower) & (log_values <= math.log(high))


def objective_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    execution_index: torch.Tensor,
    coefficients: torch.Tensor,
    spec: ObjectiveSpec,
) -> torch.Tensor:
    """The loss over targets [U] (`logprobs` with gradient; the rest recorded) of executions [E]."""
    num_executions = advantages.shape[0]
    index = execution_index.long()
    lp = logprobs.double()
    log_ratio = lp.detach() - behaviour_logprobs.double()
    if spec.token_correction == "mis":
        keep = _within(log_ratio, spec.mis_low, spec.mis_high)
    elif spec.token_correction == "icepop":
        keep = _within(log_ratio, spec.icepop_low, spec.icepop_high)
    else:
        keep = torch.ones_like(log_ratio, dtype=torch.bool)
    zeros = torch.zeros(num_executions, dtype=torch.float64, device=lp.device)
    kept = zeros.index_add(0, index, keep.double())
    every = zeros.index_add(0, index, torch.ones_like(log_ratio))
    log_s = zeros.index_add(0, index, torch.where(keep, log_ratio, 0.0)) / kept.clamp(min=1.0)
    adv = advantages.double()
    live = ~(
        ((adv > 0) & (log_s > math.log(spec.clip_high))) | ((adv < 0) & (log_s < math.log(spec.clip_low)))
    )
    if spec.sequence_mask:
        live &= _within(log_s, spec.sequence_mask_low, spec.sequence_mask_high)
    ratio = torch.exp(log_ratio)
    weight = ratio if spec.token_correction == "mis" else torch.clamp(ratio, max=spec.token_ratio_cap)
    normalizer = torch.where(kept > 0, every / kept.clamp(min=1.0), 0.0)
    on = (live[index] & keep).double()
    token_loss = torch.clamp(-(on * weight * adv[index]) * lp, max=spec.token_loss_cap)
    return (coefficients.double() * normalizer[index] * token_loss).sum()


def microstep_objective(
    step: MicroStep,
    logits_fn: LogitsFn,
    spec: ObjectiveSpec,
    *,
    chunk_tokens: int | None = None,
    device: torch.device | str = "cpu",
    mismatch: Mismatch | None = None,
    corrections: TargetsObserver | None = None,
    routing_replay: bool = False,
) -> torch.Tensor:
    """The loss of a whole micro-step (with gradient), its logits taken in the row chunks a trainer takes
    (`chunk_tokens`, default the micro-step's budget); the caller runs backward. `routing_replay`: the
    forward routes each token through the engine's recorded experts, as the run's trainer did. `mismatch` and
    `corrections` are given the targets' log-probs against the engine's (see `Mismatch`, `corrections.py`)."""
    targets = np.flatnonzero(step.target_mask)
    predecessors = step.layout.predecessors()
    cu = [int(x) for x in step.cu_seqlens]
    chunks = row_chunks(step.cu_seqlens, step.token_budget if chunk_tokens is None else chunk_tokens)

    def put(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values)).to(device=device, dtype=dtype)

    pieces: list[torch.Tensor] = []
    for r0, r1 in chunks:
        a, b = cu[r0], cu[r1]
        tree = step.tree if step.tree is None or (r0, r1) == (0, step.num_rows) else step.tree.rows(r0, r1)
        if tree is not None and tree.is_paths:
            tree = None
        routed = (
            [put(step.routed_experts[a:b], torch.int64)]
            if routing_replay and step.routed_experts is not None
            else []
        )
        logits = logits_fn(
            put(step.input_ids[a:b], torch.int64),
            put(step.position_ids[a:b], torch.int64),
            put(step.cu_seqlens[r0 : r1 + 1] - a, torch.int32),
            tree,
            *routed,
        )
        mine = targets[(targets >= a) & (targets < b)]
        rows = logits[put(predecessors[mine] - a, torch.int64)]
        rows = rows.to(torch.promote_types(rows.dtype, torch.float32))
        picked = put(step.input_ids[mine], torch.int64).unsqueeze(1)
        pieces.append(torch.log_softmax(rows, dim=-1).gather(1, picked).squeeze(1))
    logprobs = torch.cat(pieces) if pieces else torch.zeros(0, device=device)
    behaviour = put(step.behaviour_logprobs[targets], torch.float64)
    if mismatch is not None:
        versions = step.behaviour_versions
        on_policy = (
            torch.ones(len(targets), dtype=torch.bool, device=device)
            if versions is None
            else put(versions[targets] == step.step, torch.bool)
        )
        mismatch.add(logprobs.detach()[on_policy], behaviour[on_policy])
    advantages = put(step.advantages, torch.float64)
    execution_index = put(step.execution_index[targets], torch.int64)
    if corrections is not None:
        corrections.add(logprobs.detach().double() - behaviour, execution_index, advantages)
    return objective_loss(
        logprobs, behaviour, advantages, execution_index, put(step.coefficients[targets], torch.float64), spec
    )
