"""Process bookkeeping: a child dies with its parent, a stop is bounded and reaches descendants."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from gyre.procs import ProcessId, alive, describe_exit, stop_processes
from tests.support.eventually import eventually_sync

# A parent that spawns a sleeping child tied to it by PR_SET_PDEATHSIG, prints the child's pid, then waits.
PARENT = """
import subprocess, sys, time
from gyre.procs import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=die_with_parent())  # scenario: idles
print(child.pid, flush=True)
time.sleep(60)  # scenario: it idles until killed
"""

# Ignores SIGTERM and has a grandchild that does too.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])  # scenario: idles
print(child.pid, flush=True)
time.sleep(60)  # scenario: it idles until killed
"""


def _gone_within(pid: int, timeout_s: float) -> bool:
    eventually_sync(lambda: not alive(pid), timeout_s=timeout_s, interval_s=0.05, what=f"pid {pid} to exit")
    return True


def test_a_child_gets_sigterm_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert alive(child)
    parent.kill()
    parent.wait()
    assert _gone_within(child, 5.0)


def test_stop_sigkills_what_ignores_sigterm_after_the_grace_with_its_descendants() -> None:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    me = ProcessId.of(proc.pid)
    assert me is not None
    t0 = time.monotonic()
    report = stop_processes([me], grace_s=0.5)
    assert time.monotonic() - t0 < 3.0
    assert sorted(report.killed) == sorted([proc.pid, grandchild]) and report.left == []
    assert not alive(proc.pid) and _gone_within(grandchild, 2.0)


def test_identity_refuses_a_reused_pid_and_exits_are_described() -> None:
    me = psutil.Process()
    assert alive(me.pid, me.create_time()) and not alive(me.pid, me.create_time() - 100.0)
    assert describe_exit(-9) == (-1, "SIGKILL", "killed by SIGKILL")
    assert describe_exit(3) == (3, "", "exited with status 3")
