"""Nothing of the embedded default listens outside loopback, at any moment: the listening sockets of every
process of a demo-sized run are polled while the core trains and satellites join it (pulling the core's
snapshot), and none is bound outside 127.0.0.1 / ::1 (the torch weight transport; gloo on `lo`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.slow

GYRE = [sys.executable, "-c", "from gyre.cli import main; main()"]
# Shaped like tests/e2e/test_elastic_run.py (a satellite joins a batch in flight), with shorter tool sleeps.
RUN = """
scheduler: {num_cells: 3, group_size: 2, batch_groups: 3, phi: 0.3333333333333333, mu: 2,
            rho_min: 0.3333333333333333, tau_s: 0.2, cell_capacity: 10}
tasks: {queries: ["add"]}
runner: {harness_args: ["--tool-latency-s", "3", "--tool-latency-max-s", "20"]}
"""


def _loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1") or ip.startswith("::ffff:127.")


class ListenerPoll:
    """Polls the TCP listeners and bound UDP sockets of a process tree; remembers any off loopback."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.polls: list[float] = []
        self.seen: set[str] = set()
        self.bad: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                tree = {self.root, *(p.pid for p in psutil.Process(self.root).children(recursive=True))}
            except psutil.Error:
                return
            for c in psutil.net_connections(kind="inet"):
                if c.pid not in tree or not c.laddr:
                    continue
                listening = c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr)
                if listening:
                    where = f"{c.laddr.ip}:{c.laddr.port}"
                    self.seen.add(where)
                    if not _loopback(c.laddr.ip):
                        self.bad.append(f"pid {c.pid} {where}")
            self.polls.append(time.time())
            self.stop.wait(0.25)


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_no_process_of_a_run_listens_outside_loopback_while_cells_train(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(RUN)
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        demo = subprocess.Popen(
            [*GYRE, "demo", "--config", str(config), "--run-id", "loopback", "--steps", "2"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": os.getcwd(), "GYRE_RUN__DIR": str(tmp_path / "runs")},
        )
    poll = ListenerPoll(demo.pid)
    poller = threading.Thread(target=poll.run, daemon=True)
    poller.start()
    try:
        assert demo.wait(timeout=400) == 0, log.read_text()[-3000:]
    finally:
        poll.stop.set()
        poller.join(5)
        if demo.poll() is None:
            demo.kill()
    assert poll.bad == [], f"listening outside loopback: {sorted(set(poll.bad))}"
    assert len(poll.seen) >= 10, poll.seen  # servers, services, engines, the rendezvous store were all seen

    events = _events(tmp_path / "runs" / "loopback")
    joins = [
        e["time_s"]
        for e in events
        if e["type"] == "gyre.v1.RoleTransitionCompleted"
        and e["event"].get("cell", 0) > 0
        and e["event"].get("toRole") == "CELL_ROLE_TRAINING"
    ]
    steps = [e["time_s"] for e in events if e["type"] == "gyre.v1.StepCompleted"]
    assert joins and steps, "no satellite joined training: the snapshot pull was not exercised"
    # Polls ran while a satellite had just pulled the snapshot and the cells trained towards the next step.
    assert any(joins[0] - 1.0 <= t <= max(steps) for t in poll.polls)
