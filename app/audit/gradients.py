"""Each replayed micro-step's gradient from the trainer's own loss against the audit's objective
(`objective.py`), on the same model at the same weights.

    checker = build_trainer(data, dtype=GRADIENT_DTYPE)      # app/audit/replay.py
    check_gradients(checker, replayed.named_weights(), record, decoded, spec=spec, tolerance=1e-6, result=r)

Called by the replay at every step before its optimizer step, with the weights the step's micro-steps were
trained at. For each micro-step: the trainer's gradient alone (`zero_grads`, `accumulate`: its loss code),
then the gradient of the audit's loss over the trainer's forward (`logits`, the same row chunks) by autograd
into the same buffer. A difference ‖g_trainer − g_audit‖₂ / ‖g_audit‖₂ above the replay's tolerance is a
defect naming the step and the micro-step. The same forward gives the step's mismatch (`objective.Mismatch`)
and its corrections' clip and mask fractions (`corrections.py`), which must equal what the trainer logged.

**Why float64.** Both gradients are taken on a float64 copy of the run's trainer (same backend, same
model code, the replayed weights cast up, no optimizer). In the run's float32, two correct
implementations of the loss differ per token by rounding (9e-8 on the audit's test run), and the tokens'
contributions to the gradient cancel one another (the advantages of a group sum to 0), which magnified
that to 1e-5 in the gradient, over the tolerance. In float64 the same amplification leaves the noise many
orders below 1e-6, while a loss with one coefficient changed by 1 % still moves the gradient by ~1e-2. The
trainer's float32 arithmetic itself is what the replay compares with the run's weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

from app.audit.corrections import StepCorrections
from app.audit.microsteps import ObjectiveResult
from app.audit.objective import Mismatch, ObjectiveSpec, microstep_objective
from gyre.rl.microstep import MicroStep
from gyre.store.step_archive import StepRecordFile

if TYPE_CHECKING:
    from gyre.trainer.backends.base import TrainerBackend

LOGGED_FIELDS = (
    "num_target_tokens",
    "clip_fraction",
    "token_mask_fraction",
    "sequence_mask_fraction",
    "num_mismatch_targets",
    "mismatch_abs_log_ratio_mean",
    "mismatch_abs_log_ratio_max",
    "mismatch_kl",
)
"""The fields of the trainer's step row (`gyre.metrics.steps`) the audit recomputes."""

GRADIENT_DTYPE = "float64"
"""The trainer dtype the gradients are compared in (see the module docstring)."""


class GradientCheck(Protocol):
    """`check_gradients` with its checker and settings bound: what the replay calls at each step."""

    def __call__(
        self, weights: Mapping[str, torch.Tensor], record: StepRecordFile, decoded: dict[str, MicroStep]
    ) -> None: ...


def gradient_rel_diff(trainer_grads: torch.Tensor, audit_grads: torch.Tensor) -> float:
    """‖a − b‖₂ / ‖b‖₂ (b: the audit's), 0 when both are zero, inf when only the audit's is."""
    delta = float(torch.linalg.vector_norm((trainer_grads - audit_grads).double()))
    scale = float(torch.linalg.vector_norm(audit_grads.double()))
    return delta / scale if scale > 0 else (0.0 if delta == 0 else float("inf"))


def check_gradients(
    checker: TrainerBackend,
    weights: Mapping[str, torch.Tensor],
    record: StepRecordFile,
    decoded: dict[str, MicroStep],
    *,
    spec: ObjectiveSpec,
    tolerance: float,
    result: ObjectiveResult,
    border: float,
    logged: dict[int, dict[str, Any]] | None,
) -> None:
    """Compare every micro-step of the step at `weights` (see the module docstring); appends to `result`.
    From the same forward, the step's mismatch and corrections (`corrections.py`), compared with the
    trainer's `logged` row of the step (`metrics.jsonl`; None: the run kept none; a step without a row is
    reported as not compared, `logged: null`)."""
    logits = getattr(checker, "logits", None)
    if logits is None:
        result.skipped = f"the {type(checker).__name__} backend has no packed `logits` forward"
        result.defects.append(f"the gradients could not be compared: {result.skipped}")
        return
    checker.load_weights(weights, record.step)
    section = getattr(getattr(checker, "spec", None), "section", None)
    chunk_tokens = getattr(section, "chunk_tokens", None)
    routing_replay = bool(getattr(section, "routing_replay", False))
    device = getattr(checker, "device", "cpu")
    worst: float | None = None
    seen = Mismatch()
    corrections = StepCorrections(spec, border)
    for mid in sorted(decoded):
        ms = decoded[mid]
        checker.zero_grads()
        checker.accumulate(ms)
        trained = checker.flat_grads.detach().clone()
        checker.zero_grads()
        loss = microstep_objective(
            ms,
            logits,
            spec,
            chunk_tokens=chunk_tokens,
            device=device,
            mismatch=seen,
            corrections=corrections,
            routing_replay=routing_replay,
        )
        if loss.requires_grad:
            torch.autograd.backward(loss)
        diff = gradient_rel_diff(trained, checker.flat_grads.detach())
        result.gradients_compared += 1
        worst = diff if worst is None else max(worst, diff)
        if diff > tolerance:
            result.defects.append(
                f"step {record.step} micro-step {mid}: the trainer's gradient differs from the audit's "
                f"objective by {diff:.3g} (‖g_trainer − g_audit‖ / ‖g_audit‖, tolerance {tolerance:g}): the "
                "trainer's loss is not the objective of docs/method.md under the run's `objective` config"
            )
    checker.zero_grads()
    result.gradient_diff_by_step.append(worst)
    result.mismatch_by_step.append(seen.to_json())
    row = {"step": record.step, **corrections.to_json(), "logged": None}
    if logged is not None:
        mine = logged.get(record.step)
        row["logged"] = None if mine is None else {k: mine.get(k) for k in LOGGED_FIELDS}
        if mine is not None:  # a row the metrics writer had not written when the run stopped: not compared
            result.defects.extend(corrections.compare(record.step, mine, seen))
    result.corrections_by_step.append(row)
