"""Restart decisions: exponential backoff, a cap, a budget per sliding window, restarts off."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.stack.restarts import RestartHistory
from gyre.config import ConfigError, load_config
from gyre.config.supervisor import SupervisorSection

POLICY = SupervisorSection(
    max_restarts=4, restart_window_s=100.0, backoff_initial_s=0.5, backoff_factor=2.0, backoff_max_s=3.0
)


def test_delays_double_up_to_the_cap_and_the_budget_gives_up() -> None:
    history = RestartHistory()
    decisions = [history.on_exit(float(t), POLICY) for t in range(5)]
    assert [d.delay_s for d in decisions[:4]] == [0.5, 1.0, 2.0, 3.0]
    assert [d.num_restarts for d in decisions[:4]] == [1, 2, 3, 4]
    assert all(d.restart for d in decisions[:4])
    assert not decisions[4].restart and decisions[4].delay_s == 0.0


def test_restarts_older_than_the_window_no_longer_count() -> None:
    history = RestartHistory()
    for t in range(4):
        history.on_exit(float(t), POLICY)
    later = history.on_exit(150.0, POLICY)
    assert later.restart and later.delay_s == 0.5 and later.num_restarts == 1


def test_restart_off_gives_up_at_the_first_exit() -> None:
    assert not RestartHistory().on_exit(0.0, SupervisorSection(restart=False)).restart


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("backoff_factor: 0.5", "backoff_factor must be >= 1"),
        ("service_stop_timeout_s: 12", "must be < stop_grace_s"),
        ("max_restarts: -1", "must be >= 0"),
    ],
)
def test_bad_supervisor_settings_name_the_fix(tmp_path: Path, text: str, hint: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(f"run:\n  supervisor:\n    {text}\n")
    with pytest.raises(ConfigError) as info:
        load_config(f, environ={})
    assert "run.supervisor" in str(info.value) and hint in str(info.value)


def test_the_default_stop_bound_is_the_readmes_20_s() -> None:
    assert load_config(None, environ={}).run.supervisor.stop_bound_s <= 20.0
