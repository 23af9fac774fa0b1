"""A satellite leaves the pool with notice while the run goes on: the elastic run of
test_elastic_run.py (K = 3, embedded engine, 2 steps) with short tool waits, so that the satellite's engine
has calls in flight, and cell 2 given notice (`DrainCell`, what `gyre cell drain 2` sends) while it serves
executions.

The scheduler's `DrainCell` feeds the policy `CellLeaving`: the cell's executions are rerouted, its engine
drained through the proxy — its in-flight calls move to the other engines with their KV — and it leaves the
proxy's table; then the stack's supervisor stops its cell agent as a planned departure (no restart, no
`ProcessExited`). Notices for the core, an unknown cell and the cell already gone are refused (exit 2). The
run completes its steps without the cell and `gyre audit` accounts for every execution and step.

A training satellite given notice (the same run with the demo's tool waits and several micro-steps per batch,
notice the moment a satellite claims one): its notice answers at once with nothing moved (its engine serves no
call), the stack stops its agent as a planned departure, and the steps complete, audited.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import nats
import nats.errors
import pytest

from app.demo.config import demo_config
from app.demo.run import DemoRun
from app.stack.state import StackState
from gyre.bus import login_url
from gyre.bus.codec import TYPE_HEADER, decode_event
from gyre.bus.subjects import subject_for
from gyre.config import load_config
from gyre.rpc import sync_channel
from gyre.v1 import common_pb2, events_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.e2e.test_elastic_run import SHAPE
from tests.support.audit import assert_audited, assert_every_execution_ended_ok
from tests.support.eventually import eventually, eventually_sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LEAVING = 2
GYRE = [sys.executable, "-c", "from app.cli import main; main()"]


def _gyre(config_file: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*GYRE, *args, "--config", str(config_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _running_requests(engine_url: str) -> int:
    """Requests the cell's embedded engine is decoding now (its `gyre_engine_running_requests` gauge)."""
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.search(r"^gyre_engine_running_requests(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    assert found is not None, text[:500]
    return int(float(found[1]))


def _drain(run_dir: Path, cell: int, engine_url: str) -> scheduler_pb2.DrainCellResponse:
    """The notice `gyre cell drain` gives, sent at once once the cell's engine decodes calls (the command's
    start-up, seconds on a busy host, would miss them: this run's calls are short)."""
    eventually_sync(
        lambda: _running_requests(engine_url), timeout_s=60, what=f"calls decoding on cell {cell}"
    )
    return _notice(run_dir, cell, timeout_s=300)


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_a_rollout_satellite_given_notice_leaves_with_its_kv_and_the_run_completes(tmp_path: Path) -> None:
    config = demo_config(
        None,
        {
            **SHAPE,
            "run": {"id": "e2eleave", "dir": str(tmp_path / "runs")},
            # Short tool waits: most of an execution's time is spent in calls, so a drain finds calls in flight.
            # Sandbox uids of its own: a run's sweep kills every process of its uids (test_cell_lost_run.py).
            "runner": {
                "harness_args": ["--tool-latency-s", "0.5", "--tool-latency-max-s", "3"],
                "sandbox": {"uid_base": 167000},
            },
            "evaluator": {"sandbox": {"uid_base": 168000}},
        },
    )
    config_file = config.run.path / "config.yaml"
    seen: dict[str, Any] = {"refused_notices": 0}
    pool = ThreadPoolExecutor(1)

    def progress(st: Any, elapsed_s: float) -> None:
        notice = seen.get("notice")
        if notice is not None and notice.done() and notice.exception() is not None:
            error = notice.exception()
            # refused while the cell switched roles: nothing changed; give notice again once it serves rollout
            assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.FAILED_PRECONDITION, (
                error
            )
            seen["refused_notices"] += 1
            notice = seen.pop("notice")
        if notice is None:
            cell = st.cells[LEAVING]
            others = [c for c in st.cells if c.cell != LEAVING and c.role == common_pb2.CELL_ROLE_ROLLOUT]
            if (
                st.steps < 2
                and cell.role == common_pb2.CELL_ROLE_ROLLOUT
                and cell.executions_routed
                and others
            ):
                seen["notice"] = pool.submit(_drain, config.run.path, LEAVING, cell.engine.url)
            return
        if "gone" not in seen and st.cells[LEAVING].role == common_pb2.CELL_ROLE_GONE:
            seen["gone"] = st.rollout_capacity
            # `gyre cell drain`, refused: the core, the cell already gone, an unknown cell
            refusals = [_gyre(config_file, "cell", "drain", c) for c in ("0", str(LEAVING), "9")]
            seen["refused"] = [(p.wait(60), p.communicate()[1]) for p in refusals]

    try:
        summary = DemoRun(config, steps=2).execute(progress=progress)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    assert "notice" in seen and "gone" in seen, seen
    drained = seen["notice"].result(timeout=60)
    calls_rerouted, kv_tokens = drained.calls_rerouted, drained.kv_migrated_tokens
    assert drained.cell == LEAVING and calls_rerouted > 0 and kv_tokens > 0, drained
    assert seen["gone"] <= 2 * config.scheduler.cell_capacity
    (core, again, unknown) = seen["refused"]
    assert core[0] == 2 and "cell 0 is the core: the core's hand-over is not built yet" in core[1], core
    assert again[0] == 2 and f"cell {LEAVING} already left the pool" in again[1], again
    assert unknown[0] == 2 and "unknown cell 9" in unknown[1], unknown
    assert all(len(e.strip().splitlines()) == 1 for _, e in seen["refused"]), seen["refused"]
    assert summary["steps"] == 2

    run_dir = config.run.path
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e for e in events if e["type"] == "gyre.v1.ProcessExited"] == []  # a planned departure
    assert_every_execution_ended_ok(events)
    steps = [e["event"] for e in events if e["type"] == "gyre.v1.StepCompleted"]
    assert len(steps) == 2 and all(LEAVING not in s.get("cells", []) for s in steps)

    scheduler_log = _log(run_dir / "logs" / "scheduler.log")
    removed = [r for r in scheduler_log if r.get("event") == "cell_removed"]
    assert [(r["cell"], r["lost"]) for r in removed] == [(LEAVING, False)], removed
    (left,) = [r for r in scheduler_log if r.get("event") == "cell_left"]
    assert (left["calls_rerouted"], left["kv_migrated_tokens"]) == (calls_rerouted, kv_tokens), left
    reroutes = [
        r for r in scheduler_log if r.get("event") == "executions_rerouted" and r["source"] == LEAVING
    ]
    assert reroutes and not any(r["recompute"] for r in reroutes), (
        reroutes
    )  # its KV moves: nothing recomputed
    drains = [r for r in _log(run_dir / "logs" / "proxy.log") if r.get("event") == "engine_drained"]
    (drain,) = [d for d in drains if d["engine"] == f"cell-{LEAVING}"]
    assert drain["kv_migrated_tokens"] == kv_tokens > 0 and drain["calls_rerouted"] == calls_rerouted, drain

    supervisor_log = _log(run_dir / "logs" / "supervisor.log")
    agent = f"cell_agent-{LEAVING}"
    (stopped,) = [r for r in supervisor_log if r.get("event") == "cell_left"]
    assert stopped["process"] == agent and stopped["reason"] == "stopped by SIGTERM (planned departure)"
    assert not [
        r
        for r in supervisor_log
        if r.get("process") == agent
        and r.get("event") in ("process_exited", "process_restarted", "cell_lost")
    ]
    assert_audited(run_dir, steps=2)


def _notice_on_first_claim(run_dir: Path, seen: dict[str, Any], over: threading.Event) -> None:
    """Give notice (`DrainCell`) to the first satellite that claims a micro-step of the first batch, at once:
    watched on the run's NATS subject (what `nats sub 'gyre.<run>.batch.microstep_claimed'` shows), since a
    micro-step here takes under a second."""

    async def watch() -> None:
        def started() -> bool:
            state = StackState.load(run_dir)
            return over.is_set() or (state is not None and bool(state.config_path))

        await eventually(started, timeout_s=300, what="the stack to start (stack.json)")
        state = StackState.load(run_dir)
        if over.is_set() or state is None:
            return
        resolved = load_config(Path(state.config_path))
        nc = await nats.connect(login_url(resolved.nats.url or "", resolved.nats.login_for("cli")))
        try:
            sub = await nc.subscribe(subject_for(resolved.run.id, events_pb2.MicroStepClaimed))
            while not over.is_set():
                try:
                    msg = await sub.next_msg(timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                claimed = decode_event(msg.headers[TYPE_HEADER], msg.data)
                assert isinstance(claimed, events_pb2.MicroStepClaimed)
                if claimed.cell != 0 and claimed.step == 0:
                    seen.update(cell=claimed.cell, claimed=claimed.microstep_id)
                    seen["notice"] = await asyncio.to_thread(_notice, run_dir, claimed.cell)
                    return
        finally:
            await nc.close()

    try:
        asyncio.run(watch())
    except Exception as e:  # asserted by the test
        seen["error"] = e


def _notice(run_dir: Path, cell: int, timeout_s: float = 60) -> scheduler_pb2.DrainCellResponse:
    """`DrainCell(cell)` to the run's scheduler, as `gyre cell drain` sends it."""
    state = StackState.load(run_dir)
    assert state is not None
    (scheduler,) = [p for p in state.processes if p.name == "scheduler"]
    with sync_channel(f"127.0.0.1:{scheduler.grpc_port}") as channel:
        response: scheduler_pb2.DrainCellResponse = scheduler_pb2_grpc.SchedulerStub(channel).DrainCell(
            scheduler_pb2.DrainCellRequest(cell=cell), timeout=timeout_s
        )
    return response


def test_a_training_satellite_given_notice_leaves_and_the_steps_complete(tmp_path: Path) -> None:
    """Notice given the moment a satellite claimed a micro-step of the first batch. It is out of the pool at
    once; its agent runs until the stack stops it about a second later, and what it finished meanwhile counts
    (computed on the batch's weights: exact) while what it held when stopped is redone by the others. Either
    way the audit finds every micro-step trained once and every step replayed."""
    config = demo_config(
        None,
        {
            **SHAPE,
            "run": {"id": "e2eleavetrain", "dir": str(tmp_path / "runs")},
            "packer": {"microstep_tokens": 600},  # several micro-steps per batch: a satellite claims some
            "runner": {**SHAPE["runner"], "sandbox": {"uid_base": 173000}},
            "evaluator": {"sandbox": {"uid_base": 174000}},
        },
    )
    seen: dict[str, Any] = {}
    over = threading.Event()
    watcher = threading.Thread(target=_notice_on_first_claim, args=(config.run.path, seen, over), daemon=True)
    watcher.start()
    try:
        summary = DemoRun(config, steps=2).execute()
    finally:
        over.set()
        watcher.join(timeout=30)
    assert "error" not in seen, seen
    assert "notice" in seen, "no satellite claimed a micro-step of the first batch"
    leaving, drained = seen["cell"], seen["notice"]
    assert (drained.cell, drained.executions_moved, drained.calls_rerouted, drained.kv_migrated_tokens) == (
        leaving,
        0,
        0,
        0,
    ), drained
    assert summary["steps"] == 2

    run_dir = config.run.path
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e for e in events if e["type"] == "gyre.v1.ProcessExited"] == []  # a planned departure
    assert_every_execution_ended_ok(events)
    assert len([e for e in events if e["type"] == "gyre.v1.StepCompleted"]) == 2
    scheduler_log = _log(run_dir / "logs" / "scheduler.log")
    removed = [r for r in scheduler_log if r.get("event") == "cell_removed"]
    assert [(r["cell"], r["lost"]) for r in removed] == [(leaving, False)], removed
    supervisor_log = _log(run_dir / "logs" / "supervisor.log")
    (stopped,) = [r for r in supervisor_log if r.get("event") == "cell_left"]
    assert stopped["process"] == f"cell_agent-{leaving}", stopped
    assert_audited(run_dir, steps=2)
