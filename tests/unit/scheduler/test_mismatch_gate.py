"""The mismatch gate: N consecutive measured steps over the bound warn or stop the run, with the reason kept."""

from __future__ import annotations

import pytest

from gyre.config.scheduler import MismatchGateSection
from gyre.v1 import events_pb2 as ev
from services.scheduler.mismatch_gate import MismatchGate
from services.scheduler.persist import ShellState
from services.scheduler.translate import EventTranslator


def _gate(action: str = "stop") -> MismatchGate:
    return MismatchGate(MismatchGateSection(action=action, max_kl=0.01, num_steps=2))


def test_it_acts_after_n_consecutive_measured_steps_over_the_bound() -> None:
    gate = _gate()
    assert gate.observe(step=0, mismatch_kl=0.02, measured=True) is None
    assert gate.observe(step=1, mismatch_kl=0.0, measured=True) is None  # the streak breaks
    assert gate.observe(step=2, mismatch_kl=0.02, measured=True) is None
    assert (
        gate.observe(step=3, mismatch_kl=0.5, measured=False) is None
    )  # unmeasured: neither counts nor breaks
    reason = gate.observe(step=4, mismatch_kl=0.03, measured=True)
    assert reason is not None and "max_kl=0.01" in reason and "step 4" in reason
    assert gate.observe(step=5, mismatch_kl=0.01, measured=True) is None  # at the bound is not over it


def test_off_never_acts() -> None:
    gate = _gate("off")
    assert all(gate.observe(step=s, mismatch_kl=9.0, measured=True) is None for s in range(5))


def _step(version: int, kl: float, *, replayed: bool = False) -> ev.StepCompleted:
    return ev.StepCompleted(
        policy_version=version, mismatch_kl=kl, num_mismatch_targets=10, replayed=replayed
    )


@pytest.mark.parametrize(("action", "stops"), [("stop", True), ("warn", False)])
def test_the_translator_stops_the_run_with_the_reason_or_only_warns(action: str, stops: bool) -> None:
    shell = ShellState()
    t = EventTranslator(shell, _gate(action))
    t.translate(_step(1, 0.02))
    t.translate(_step(1, 0.02, replayed=True))  # a replayed report of a step is not a second step
    assert not shell.stopping
    t.translate(_step(2, 0.02))
    assert shell.stopping is stops
    assert ("step 1" in shell.stop_reason) is stops
    restored = ShellState.from_dict(shell.to_dict())
    assert restored.stop_reason == shell.stop_reason


def test_a_shell_persisted_before_the_gate_restores_without_a_reason() -> None:
    data = ShellState().to_dict()
    del data["stop_reason"]
    assert ShellState.from_dict(data).stop_reason == ""
