"""Which run `gyre status` / `gyre down` act on: explicit, configured, else the only live one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from app.stack.launcher import ProcessEntry, StackState, live_runs, resolve_run


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _record(runs: Path, run_id: str, pid: int) -> Path:
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    StackState(run_id, str(run_dir), "", [ProcessEntry("scheduler", pid)]).save()
    return run_dir


def test_the_only_live_run_is_found_when_the_configured_one_has_no_stack(tmp_path: Path) -> None:
    _record(tmp_path, "stale", _dead_pid())
    demo = _record(tmp_path, "demo-20261130-004428", os.getpid())
    assert live_runs(tmp_path) == [demo]
    assert resolve_run(tmp_path, "local", None) == demo


def test_configured_run_wins_and_explicit_run_wins_over_it(tmp_path: Path) -> None:
    local = _record(tmp_path, "local", os.getpid())
    _record(tmp_path, "demo-a", os.getpid())
    assert resolve_run(tmp_path, "local", None) == local
    assert resolve_run(tmp_path, "local", "demo-a") == tmp_path / "demo-a"


def test_two_live_runs_and_no_configured_one_is_ambiguous(tmp_path: Path) -> None:
    _record(tmp_path, "demo-a", os.getpid())
    _record(tmp_path, "demo-b", os.getpid())
    assert resolve_run(tmp_path, "local", None) is None
    assert resolve_run(tmp_path / "missing", "local", None) is None
