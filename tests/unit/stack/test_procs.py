"""Process bookkeeping: a child dies with its parent, a stop is bounded and reaches descendants."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from gyre.procs import ProcessId, alive, crash_tree, describe_exit, stop_processes
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


# Four loops that each start a short-lived process as fast as they can, as a sandbox running commands does:
# the tree changes between any listing of it and any signal to it.
FORKING = "for i in 1 2 3 4; do (while true; do /bin/true; (sleep 0.001); done) & done; wait"


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


def test_a_crash_kills_a_tree_that_keeps_forking_whole_without_tripping_on_what_ends_meanwhile() -> None:
    for _ in range(3):  # the listing-then-signal of before raised NoSuchProcess in 7 of 10 such crashes
        tree = subprocess.Popen(["bash", "-c", FORKING], start_new_session=True)
        eventually_sync(  # bash and its four loops
            lambda pid=tree.pid: len(psutil.Process(pid).children()) >= 4, timeout_s=10, what="the loops"
        )
        killed = crash_tree(tree.pid)
        tree.wait(5)
        assert len(killed) >= 5, killed  # bash and its four loops, at least
        assert not [p for p in killed if alive(p.pid, p.started)]

        # the whole process group, not only what crash_tree says it found
        eventually_sync(
            lambda pgid=tree.pid: not _group(pgid),
            timeout_s=10,
            interval_s=0.05,
            what="the forking tree's end",
        )


def _group(pgid: int) -> list[int]:
    """The live (non-zombie) processes of process group `pgid`."""
    return [p.pid for p in psutil.process_iter(["status"]) if _in_group(p, pgid)]


def _in_group(p: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False
