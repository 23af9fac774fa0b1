"""The `StepCompleted` fields of a step's merged loss metrics that the agent and the replay both report: the
objective's mask fractions and the train/inference mismatch (docs/method.md, "Mismatch measured").

    ev.StepCompleted(..., **correction_fields(metrics))
"""

from __future__ import annotations

from gyre.rl.loss import LossMetrics


def correction_fields(metrics: LossMetrics) -> dict[str, float | int]:
    """The `StepCompleted` fields of the objective's corrections and of the train/inference mismatch
    (0 where nothing was measured: the wire has no NaN)."""
    s = metrics.summary()

    def value(key: str) -> float:
        v = s[key]
        return 0.0 if v != v else v  # NaN: nothing was seen

    return {
        "token_mask_fraction": value("token_mask_fraction"),
        "sequence_mask_fraction": value("sequence_mask_fraction_executions"),
        "num_mismatch_targets": metrics.num_mismatch_targets,
        "mismatch_kl": value("mismatch_kl_token_mean"),
        "mismatch_kl_execution": value("mismatch_kl_execution_mean"),
        "mismatch_abs_log_ratio_mean": value("mismatch_abs_log_ratio_mean"),
        "mismatch_abs_log_ratio_max": value("mismatch_abs_log_ratio_max"),
        "mismatch_over_bound_fraction": value("mismatch_over_bound_fraction"),
    }
