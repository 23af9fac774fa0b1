"""The mismatch corrections' clip and mask fractions of each replayed step, from primary data, and their
comparison with what the trainer logged for the step (`metrics.jsonl`).

    seen = StepCorrections(spec, border=border_log(trainer_dtype))
    microstep_objective(ms, logits, spec, corrections=seen)          # at the step's weights, every micro-step
    seen.to_json(), seen.compare(logged_row, mismatch)                 # the report's row, the defects

The log ratio of every target, log ρ_u = log π_θ(y_u) − log p_u^roll, comes from the audit's own forward at
the weights the step trained (`objective.microstep_objective`) and the engine's recorded log-probs in the
micro-step; from it the fractions of each correction are counted here, written from docs/method.md
("Mismatch corrections") like `objective.py` and independent of the trainer's loss and metrics code:

    token_mask_fraction       targets outside the token band (mis, icepop) / targets
    clip_fraction             executions with a kept target whose m_i is 0 (s_i over the kept targets) / executions
    sequence_mask_fraction    executions with a kept target whose s_i leaves the sequence band / executions
    token_capped_fraction     targets whose ρ_u exceeds token_ratio_cap (the weight of tis and icepop) / targets

for the run's objective (`run`, compared with the trainer's log) and, offline from the same log ratios, for
each correction switched on alone with the run's bounds (`tis`, `mis`, `icepop`, `sequence_mask`).

**Tolerance.** The trainer decided in its own dtype, the audit in float64; the log-probs differ by rounding,
so a target or an execution whose decision lies within `border` (in log space) of a bound may go either
way. The trainer's count may differ from the audit's by at most the number of such borderline items
(`border_log`: 1000 ε of the trainer's dtype, 1.2e-4 in float32, where the measured difference of the
log-probs is under 1e-5). A difference beyond that, or in the number of targets, is a defect naming the
step and the field. The mismatch the trainer logged (`objective.Mismatch`'s fields) is compared the same way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from app.audit.objective import Mismatch, ObjectiveSpec

BORDER_EPS = 1000.0
"""`border_log` in units of the trainer dtype's machine epsilon."""


def border_log(trainer_dtype: str) -> float:
    """How far (in log space) the trainer's log-probs may lie from the audit's float64 ones."""
    return BORDER_EPS * torch.finfo(getattr(torch, trainer_dtype)).eps


def variants(spec: ObjectiveSpec) -> dict[str, ObjectiveSpec]:
    """The run's objective and each correction alone, with the run's bounds."""
    alone = dataclasses.replace(spec, token_correction="tis", sequence_mask=False)
    return {
        "run": spec,
        "tis": alone,
        "mis": dataclasses.replace(alone, token_correction="mis"),
        "icepop": dataclasses.replace(alone, token_correction="icepop"),
        "sequence_mask": dataclasses.replace(alone, sequence_mask=True),
    }


def _log(value: float) -> float:
    return math.log(value) if value > 0 else -math.inf


def _near(values: torch.Tensor, bounds: list[float], border: float) -> torch.Tensor:
    near = torch.zeros_like(values, dtype=torch.bool)
    for b in bounds:
        if math.isfinite(b):
            near |= (values - b).abs() <= border
    return near


@dataclass(slots=True)
class Counts:
    """One objective's counts over a step's targets (sums over its micro-steps)."""

    targets: int = 0
    executions: int = 0
    token_masked: int = 0
    token_capped: int = 0
    clipped_executions: int = 0
    sequence_masked_executions: int = 0
    border_targets: int = 0
    """Targets within `border` of a token band bound."""
    border_executions: int = 0
    """Executions within `border` of a clip or sequence bound, or holding a border target."""

    def add(
        self,
        log_ratio: torch.Tensor,
        execution_index: torch.Tensor,
        advantages: torch.Tensor,
        spec: ObjectiveSpec,
        border: float,
    ) -> None:
        """Targets [U] (float64 log ρ, execution index) of executions [E] (advantages)."""
        e = advantages.shape[0]
        band = {"mis": (spec.mis_low, spec.mis_high), "icepop": (spec.icepop_low, spec.icepop_high)}
        bounds = band.get(spec.token_correction)
        keep = torch.ones_like(log_ratio, dtype=torch.bool)
        near_token = torch.zeros_like(keep)
        if bounds is not None:
            low, high = _log(bounds[0]), _log(bounds[1])
            keep = (log_ratio >= low) & (log_ratio <= high)
            near_token = _near(log_ratio, [low, high], border)
        zeros = torch.zeros(e, dtype=torch.float64)
        present = zeros.index_add(0, execution_index, torch.ones_like(log_ratio)) > 0
        kept = zeros.index_add(0, execution_index, keep.double())
        scored = kept > 0
        log_s = zeros.index_add(0, execution_index, torch.where(keep, log_ratio, 0.0)) / kept.clamp(min=1.0)
        adv = advantages.double()
        high, low = math.log(spec.clip_high), math.log(spec.clip_low)
        clipped = scored & (((adv > 0) & (log_s > high)) | ((adv < 0) & (log_s < low)))
        execution_bounds = [high, low]
        if spec.sequence_mask:
            s_low, s_high = _log(spec.sequence_mask_low), _log(spec.sequence_mask_high)
            masked = scored & ~((log_s >= s_low) & (log_s <= s_high))
            execution_bounds += [s_low, s_high]
        else:
            masked = torch.zeros_like(scored)
        holds_near = zeros.index_add(0, execution_index, near_token.double()) > 0
        near_exec = present & (holds_near | (scored & _near(log_s, execution_bounds, border)))
        capped = (
            torch.zeros_like(keep)
            if spec.token_correction == "mis"
            else log_ratio > math.log(spec.token_ratio_cap)
        )
        self.targets += int(log_ratio.numel())
        self.executions += int(present.sum())
        self.token_masked += int((~keep).sum())
        self.token_capped += int(capped.sum())
        self.clipped_executions += int(clipped.sum())
        self.sequence_masked_executions += int(masked.sum())
        self.border_targets += int(near_token.sum())
        self.border_executions += int(near_exec.sum())

    def fractions(self) -> dict[str, float | None]:
        t, e = self.targets, self.executions
        return {
            "token_mask_fraction": self.token_masked / t if t else None,
            "token_capped_fraction": self.token_capped / t if t else None,
            "clip_fraction": self.clipped_executions / e if e else None,
            "sequence_mask_fraction": self.sequence_masked_executions / e if e else None,
        }


@dataclass(slots=True)
class StepCorrections:
    """Every variant's counts over one step's targets; `add` is what `microstep_objective` calls."""

    spec: ObjectiveSpec
    border: float
    counts: dict[str, Counts] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.counts = {name: Counts() for name in variants(self.spec)}

    def add(self, log_ratio: torch.Tensor, execution_index: torch.Tensor, advantages: torch.Tensor) -> None:
        lr, index = log_ratio.detach().double().cpu(), execution_index.long().cpu()
        adv = advantages.detach().double().cpu()
        for name, spec in variants(self.spec).items():
            self.counts[name].add(lr, index, adv, spec, self.border)

    def to_json(self) -> dict[str, Any]:
        run = self.counts["run"]
        return {
            "targets": run.targets,
            "executions": run.executions,
            "border_log": self.border,
            "border_targets": run.border_targets,
            "border_executions": run.border_executions,
            "variants": {name: c.fractions() for name, c in self.counts.items()},
        }

    def compare(self, step: int, logged: dict[str, Any], mismatch: Mismatch) -> list[str]:
        """Defects where the trainer's logged row of the step disagrees with the audit's counts."""
        run, where = self.counts["run"], f"step {step}: the trainer logged"
        defects: list[str] = []
        if int(logged.get("num_target_tokens", -1)) != run.targets:
            defects.append(
                f"{where} {logged.get('num_target_tokens')} targets, the micro-steps hold {run.targets}"
            )
            return defects
        checks = (
            ("token_mask_fraction", run.token_masked, run.targets, run.border_targets),
            ("clip_fraction", run.clipped_executions, run.executions, run.border_executions),
            ("sequence_mask_fraction", run.sequence_masked_executions, run.executions, run.border_executions),
        )
        for key, count, total, slack in checks:
            value = logged.get(key)
            if value is None or not total:
                continue
            if abs(float(value) * total - count) > slack + 1e-6:
                defects.append(
                    f"{where} {key} {float(value):.6g}, the audit counts {count}/{total} = {count / total:.6g} "
                    f"from the engine's log-probs and its own forward ({slack} within {self.border:.2g} of a bound)"
                )
        defects.extend(_compare_mismatch(where, logged, mismatch, self.border))
        return defects


def _compare_mismatch(where: str, logged: dict[str, Any], mismatch: Mismatch, border: float) -> list[str]:
    mine = mismatch.to_json()
    if int(logged.get("num_mismatch_targets", -1)) != mine["tokens"]:
        return [
            f"{where} the mismatch over {logged.get('num_mismatch_targets')} on-policy targets, the micro-steps "
            f"hold {mine['tokens']}"
        ]
    if not mine["tokens"]:
        return []
    slack_kl = border * math.exp(mine["max_abs"] + border)
    pairs = (
        ("mismatch_abs_log_ratio_mean", "mean_abs", border),
        ("mismatch_abs_log_ratio_max", "max_abs", border),
        ("mismatch_kl", "k3_kl_token_mean", slack_kl),
    )
    return [
        f"{where} {key} {logged.get(key)}, the audit measures {mine[ours]:.6g} (tolerance {slack:.2g})"
        for key, ours, slack in pairs
        if logged.get(key) is None or abs(float(logged[key]) - mine[ours]) > slack
    ]
