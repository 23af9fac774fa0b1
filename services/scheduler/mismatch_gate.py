"""The mismatch gate: warn about, or stop, a run whose train/inference mismatch stays above a bound.

The core reports each step's mismatch (`StepCompleted.mismatch_kl`: the mean k3 per target sampled at the
trainer's own version, docs/method.md "Mismatch measured"). The scheduler's event translator feeds every
step to `MismatchGate.observe`; once `num_steps` consecutive measured steps are over `max_kl` it returns the
reason, on that step and every later one while the streak lasts. With `action: stop` the scheduler then ends
the run the way `max_steps` does (no more batches, dispatch or starts) and records the reason
(`SchedulerState.stop_reason`, `summary.json`); with `warn` it logs it. A step that measured no target (all
its groups stale) neither counts nor breaks the streak. The streak lives in memory: a restarted scheduler
counts again from zero.

    gate = MismatchGate(config.scheduler.mismatch_gate)
    reason = gate.observe(step=7, mismatch_kl=0.02, measured=True)
"""

from __future__ import annotations

from gyre.config.scheduler import MismatchGateSection


class MismatchGate:
    def __init__(self, section: MismatchGateSection) -> None:
        self.section = section
        self.streak = 0
        """Consecutive measured steps over the bound, up to the last one observed."""

    def observe(self, *, step: int, mismatch_kl: float, measured: bool) -> str | None:
        """Take one step's mismatch; the reason to warn or stop, or None."""
        s = self.section
        if s.action == "off" or not measured:
            return None
        self.streak = self.streak + 1 if mismatch_kl > s.max_kl else 0
        if self.streak < s.num_steps:
            return None
        return (
            f"mismatch KL {mismatch_kl:.4g} over scheduler.mismatch_gate.max_kl={s.max_kl:g} for "
            f"{self.streak} consecutive steps (up to step {step})"
        )
