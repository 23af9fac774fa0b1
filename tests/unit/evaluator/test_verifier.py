"""Reading a verifier's verdict, and mapping a harness's end to a termination reason."""

from __future__ import annotations

import pytest

from gyre.sandbox import SandboxOutcome
from gyre.v1 import common_pb2 as cm
from services.evaluator.rewards import parse_score
from services.runner.execution import reason_of


@pytest.mark.parametrize(
    ("stdout", "score"),
    [
        ('noise\n{"score": 0.25, "parts": {}}\n', 0.25),
        ('{"score": 1}\n\n', 1.0),
        ('{"score": 0}', 0.0),
    ],
)
def test_the_last_json_line_carries_the_score(stdout: str, score: float) -> None:
    assert parse_score(stdout)[0] == score


@pytest.mark.parametrize(
    ("stdout", "why"),
    [
        ("", "printed nothing"),
        ('{"score": 0.5}\ntrailing text', "not JSON"),
        ('{"score": 1.5}', "no score in [0, 1]"),
        ('{"score": true}', "no score in [0, 1]"),
        ('{"value": 1}', "no score in [0, 1]"),
        ("[0.5]", "no score in [0, 1]"),
    ],
)
def test_anything_else_is_a_failed_attempt_never_a_zero(stdout: str, why: str) -> None:
    score, detail = parse_score(stdout)
    assert score is None and why in detail


def test_reason_comes_from_how_the_harness_ended() -> None:
    assert reason_of(SandboxOutcome(0, None, True)) == cm.TERMINATION_REASON_COMPLETED
    assert reason_of(SandboxOutcome(3, None, True)) == cm.TERMINATION_REASON_FAILED
    assert reason_of(SandboxOutcome(None, 9, True)) == cm.TERMINATION_REASON_FAILED
    assert reason_of(SandboxOutcome(127, None, False, "exec failed")) == cm.TERMINATION_REASON_INFRA_FAILURE
