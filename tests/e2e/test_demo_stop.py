"""Every stop of a `gyre demo` brings every process of the run down within the stated bound (20 s):
SIGTERM to the demo mid-run, and SIGKILL of the demo's own process (its supervisor, tied to it by
PR_SET_PDEATHSIG, then stops the run by itself). A tiny run: 1 step, groups of 2, short tool sleeps so
that the stop lands while harness executions are live in their sandboxes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gyre.procs import ProcessId, alive
from tests.support.eventually import eventually_sync

pytestmark = pytest.mark.slow

GYRE = [sys.executable, "-c", "from app.cli import main; main()"]
STOP_BOUND_S = 20.0
TINY = """
scheduler: {num_cells: 2, group_size: 2, batch_groups: 1, phi: 0, mu: 1, rho_min: 1.0, tau_s: 0.2,
            cell_capacity: 4, max_steps: 1}
tasks: {queries: ["add/3+3"]}
runner: {harness_args: ["--tool-latency-s", "4", "--tool-latency-max-s", "6"]}
"""


def _start_demo(tmp_path: Path, run_id: str) -> tuple[subprocess.Popen[bytes], Path]:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        demo = subprocess.Popen(
            [*GYRE, "demo", "--config", str(config), "--run-id", run_id, "--steps", "1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.getcwd(), "GYRE_RUN__DIR": str(tmp_path / "runs")},
        )
    return demo, log


def _tree_once_harnesses_run(
    demo: subprocess.Popen[bytes], log: Path, timeout_s: float = 180.0
) -> list[ProcessId]:
    """Every process of the run (the demo and its descendants) once a harness execution is live and the
    process tree has stopped growing (the sandboxes settled into their tool sleeps)."""
    seen: list[set[int]] = []

    def tree() -> list[psutil.Process]:
        assert demo.poll() is None, log.read_text()[-3000:]
        try:
            return [psutil.Process(demo.pid), *psutil.Process(demo.pid).children(recursive=True)]
        except psutil.Error:
            return []

    def settled() -> bool:
        processes = tree()
        try:
            running = any("harness" in " ".join(p.cmdline()) for p in processes)
        except psutil.Error:
            return False
        seen.append({p.pid for p in processes})
        return running and len(seen) >= 2 and seen[-1] == seen[-2]

    eventually_sync(settled, timeout_s=timeout_s, interval_s=0.5, what=f"a harness execution ({log})")
    found = [ProcessId.of(p.pid) for p in tree()]
    return [p for p in found if p is not None]


def _command(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()[:4])
    except psutil.Error:  # exited since it was seen alive
        return f"pid {pid} (exited)"


def _left_after(tree: list[ProcessId], bound_s: float) -> list[str]:
    """The commands of `tree` still running `bound_s` from now (none once every process has exited)."""

    def left() -> list[ProcessId]:
        return [p for p in tree if alive(p.pid, p.started)]

    with contextlib.suppress(AssertionError):
        eventually_sync(
            lambda: not left(), timeout_s=bound_s, interval_s=0.2, what="the run's processes to exit"
        )
    return [_command(p.pid) for p in left()]


def test_sigterm_mid_run_stops_every_process_within_the_bound(tmp_path: Path) -> None:
    demo, log = _start_demo(tmp_path, "stopterm")
    try:
        tree = _tree_once_harnesses_run(demo, log)
        assert len(tree) >= 12  # demo, supervisor, nats, redis, 6 services (2 cells), sandboxes, harnesses
        t0 = time.monotonic()
        demo.send_signal(signal.SIGTERM)
        left = _left_after(tree, STOP_BOUND_S)
        stopped_s = time.monotonic() - t0
    finally:
        if demo.poll() is None:
            demo.kill()
    assert left == [], f"still running {STOP_BOUND_S:.0f} s after SIGTERM: {left}"
    assert demo.wait(5) == 128 + signal.SIGTERM, log.read_text()[-2000:]
    assert not (tmp_path / "runs" / "stopterm" / "stack.json").exists()
    print(f"SIGTERM: {len(tree)} processes gone in {stopped_s:.1f} s")


def test_sigkill_of_the_demo_stops_its_services_within_the_bound(tmp_path: Path) -> None:
    demo, log = _start_demo(tmp_path, "stopkill")
    try:
        tree = _tree_once_harnesses_run(demo, log)
        t0 = time.monotonic()
        demo.kill()
        demo.wait(5)
        left = _left_after(tree, STOP_BOUND_S)
        stopped_s = time.monotonic() - t0
    finally:
        if demo.poll() is None:
            demo.kill()
    assert left == [], f"still running {STOP_BOUND_S:.0f} s after the demo was SIGKILLed: {left}"
    assert "stack_stopped" in (tmp_path / "runs" / "stopkill" / "logs" / "supervisor.log").read_text()
    print(f"SIGKILL: {len(tree)} processes gone in {stopped_s:.1f} s")
