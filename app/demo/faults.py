"""Fault injection into a live `gyre demo` run, and the per-fault report (tests/faults, `gyre bench faults`).

    injector = FaultInjector(run_dir, [Fault("scheduler", at_step=0), Fault("core", at_step=1, when="training")])
    summary = DemoRun(config, steps=4).execute(progress=injector.progress)   # faults land one after another
    report = fault_report(read_event_lines(run_dir / "events.jsonl"), injector.done, steps=4)

A `Fault` names a process of the run as `stack.json` does (`scheduler`, `cell_agent-0`, `nats`, ...) or by
role (`core` = cell_agent-0, `satellite` = the last cell agent), and an action: `kill` (SIGKILL; the stack's
supervisor restarts it), `stop` (SIGSTOP for `stop_s`, then SIGCONT), `kill_engine` (SIGKILL the process
group of the SGLang server a cell agent launched, once it runs a call; the cell's launcher restarts it),
`hold_engine` (SIGSTOP that process group once it runs a call while its cell serves rollout, and SIGCONT it
once the cell's role switch has begun: every call on it stays in flight until the switch — what a long
generation does on a GPU, where calls span switches — or after `wait_s`) or `hang_verifier` (SIGSTOP a
verifier process in the evaluator's sandbox uids and leave it stopped: the evaluator's timeout must deal
with it).
Faults are injected in order, each once the run has reached `at_step` steps and its `when` holds (`live`:
executions are running; `training`: the core is training), and the next only after the previous one
recovered. `recovery_s`: injection → the process answers SERVING again (servers: accepts connections;
`stop`: counted from SIGCONT; `kill_engine`: a new server answers `/health`; `hold_engine`: how long the
server was held; `hang_verifier`: until the stopped verifier is gone).

The report attributes each invariant violation (app/demo/ledger.py) to the fault whose window
[injection, next injection) it falls in; `harness_errors` counts the executions in that window that ended
other than completed or cancelled (what a harness saw go wrong).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from app.demo.ledger import Event, check_events
from app.stack.health import grpc_health
from app.stack.state import ProcessEntry, StackState
from gyre.procs import ProcessId, crash_tree
from gyre.v1 import common_pb2, scheduler_pb2

Action = Literal["kill", "stop", "kill_engine", "hold_engine", "hang_verifier"]
ENGINE_MODULE = "sglang.launch_server"
"""What a cell agent's SGLang server runs (`kill_engine` finds it among the agent's children by it)."""
When = Literal["any", "live", "training"]
_OK_ENDINGS = ("TERMINATION_REASON_COMPLETED", "TERMINATION_REASON_CANCELLED")
_ROLLOUT = common_pb2.CELL_ROLE_ROLLOUT


@dataclass(slots=True)
class Fault:
    """One fault to inject (see the module docstring)."""

    target: str
    at_step: int = 0
    when: When = "live"
    action: Action = "kill"
    stop_s: float = 10.0
    name: str = ""
    """The name in the report; `target` (with `-stop` / the action) when empty."""

    def label(self) -> str:
        return self.name or (self.target if self.action == "kill" else f"{self.target}-{self.action}")


@dataclass(slots=True)
class Injection:
    """What happened to one fault."""

    fault: Fault
    at_s: float = 0.0
    """Epoch seconds of the injection (0: never injected)."""
    recovery_s: float | None = None
    detail: str = ""


class FaultInjector:
    """Injects `faults` into the run under `run_dir` from its own thread; `progress` is DemoRun's callback."""

    def __init__(
        self, run_dir: Path, faults: list[Fault], verifier_uids: range = range(0), wait_s: float = 180.0
    ) -> None:
        self.run_dir = run_dir.resolve()
        self.faults = faults
        self.verifier_uids = verifier_uids
        self.wait_s = wait_s
        self.done: list[Injection] = []
        self._state: scheduler_pb2.SchedulerState | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="fault-injector", daemon=True)
        self._over = threading.Event()

    def progress(self, state: scheduler_pb2.SchedulerState, elapsed_s: float) -> None:
        with self._changed:
            self._state = state
            self._changed.notify_all()
        if not self._thread.is_alive() and not self._over.is_set() and len(self.done) < len(self.faults):
            self._thread.start()

    def stop(self) -> None:
        self._over.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    # -- the thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        for fault in self.faults:
            injection = Injection(fault)
            self.done.append(injection)
            if not self._wait_for(fault):
                injection.detail = "not injected: its moment never came"
                continue
            try:
                self._inject(injection)
            except Exception as e:  # the report says what went wrong; the run goes on
                injection.detail = f"{type(e).__name__}: {e}"

    def _ready(self, fault: Fault) -> bool:
        st = self._state
        if st is None or st.steps < fault.at_step:
            return False
        if fault.when == "live":
            return st.counters.started > st.counters.finished
        if fault.when == "training":
            return bool(st.cells) and st.cells[0].role == common_pb2.CELL_ROLE_TRAINING
        return True

    def _wait_for(self, fault: Fault) -> bool:
        deadline = time.monotonic() + self.wait_s
        with self._changed:
            while not self._over.is_set() and time.monotonic() < deadline:
                if self._ready(fault):
                    return True
                self._changed.wait(timeout=1.0)
        return False

    def _entry(self, target: str) -> ProcessEntry:
        state = StackState.load(self.run_dir)
        if state is None:
            raise RuntimeError("no stack.json: the run is not up")
        names = [p.name for p in state.processes]
        cells = sorted(n for n in names if n.startswith("cell_agent-"))
        name = {"core": "cell_agent-0", "satellite": cells[-1] if cells else ""}.get(target, target)
        for p in state.processes:
            if p.name == name:
                return p
        raise RuntimeError(f"no process {name!r} in stack.json; it has {names}")

    def _inject(self, injection: Injection) -> None:
        fault = injection.fault
        if fault.action == "hang_verifier":
            self._hang_verifier(injection)
            return
        entry = self._entry(fault.target)
        if fault.action == "kill_engine":
            self._kill_engine(injection, entry)
            return
        if fault.action == "hold_engine":
            self._hold_engine(injection, entry)
            return
        injection.at_s = time.time()
        t0 = time.monotonic()
        if fault.action == "kill":
            os.kill(entry.pid, signal.SIGKILL)
            injection.recovery_s = self._recovered(entry, t0, new_pid=True)
            return
        os.kill(entry.pid, signal.SIGSTOP)
        self._over.wait(fault.stop_s)
        os.kill(entry.pid, signal.SIGCONT)
        injection.recovery_s = self._recovered(entry, time.monotonic(), new_pid=False)

    def _recovered(self, old: ProcessEntry, t0: float, new_pid: bool) -> float | None:
        deadline = t0 + self.wait_s
        while time.monotonic() < deadline and not self._over.is_set():
            entry = self._entry(old.name)
            if (
                entry.state == "running"
                and entry.alive()
                and (entry.pid != old.pid or not new_pid)
                and _serving(entry)
            ):
                return round(time.monotonic() - t0, 2)
            time.sleep(0.2)
        return None

    def _engine_running_a_call(
        self, injection: Injection, entry: ProcessEntry, also: Callable[[], bool] = lambda: True
    ) -> tuple[int, int] | None:
        """(pid, port) of the cell's SGLang server once it runs a call and `also()` holds; None (the
        injection's detail says why) if that did not happen within `wait_s`."""
        deadline = time.monotonic() + self.wait_s
        server = _engine_server(entry.pid)
        while server is None or not also() or _running_calls(server[1]) < 1:
            if time.monotonic() > deadline or self._over.is_set():
                injection.detail = "not injected: the engine ran no call" if server else "no engine server"
                return None
            time.sleep(0.1)
            server = _engine_server(entry.pid)
        return server

    def _kill_engine(self, injection: Injection, entry: ProcessEntry) -> None:
        """SIGKILL the cell's SGLang server (its whole process group) once it runs a call, then wait for
        the launcher's restart to answer `/health`."""
        server = self._engine_running_a_call(injection, entry)
        if server is None:
            return
        pid, port = server
        injection.at_s, t0 = time.time(), time.monotonic()
        os.killpg(pid, signal.SIGKILL)
        injection.detail = f"engine pid {pid} on port {port} killed"
        while time.monotonic() < t0 + self.wait_s and not self._over.is_set():
            again = _engine_server(entry.pid)
            if again is not None and again[0] != pid and _healthy(again[1]):
                injection.recovery_s = round(time.monotonic() - t0, 2)
                return
            time.sleep(0.2)

    def _hold_engine(self, injection: Injection, entry: ProcessEntry) -> None:
        """SIGSTOP the cell's SGLang server (its whole process group) once it runs a call while the cell
        serves rollout; SIGCONT it once the scheduler reports the cell's switch begun (or after `wait_s`)."""
        cell = int(entry.name.removeprefix("cell_agent-"))
        server = self._engine_running_a_call(injection, entry, also=lambda: self._role(cell) == _ROLLOUT)
        if server is None:
            return
        pid, port = server
        injection.at_s, t0 = time.time(), time.monotonic()
        os.killpg(pid, signal.SIGSTOP)
        try:
            deadline = t0 + self.wait_s
            with self._changed:
                while (
                    self._role(cell) == _ROLLOUT and not self._over.is_set() and time.monotonic() < deadline
                ):
                    self._changed.wait(timeout=1.0)
            switched = self._role(cell) != _ROLLOUT
        finally:
            os.killpg(pid, signal.SIGCONT)
        injection.recovery_s = round(time.monotonic() - t0, 2)
        injection.detail = f"engine pid {pid} on port {port} held " + (
            "until its cell's switch began" if switched else "and released: its cell did not switch"
        )

    def _role(self, cell: int) -> int:
        """The cell's role in the scheduler's last reported state (unspecified before any)."""
        st = self._state
        if st is None or cell >= len(st.cells):
            return common_pb2.CELL_ROLE_UNSPECIFIED
        return int(st.cells[cell].role)

    def _hang_verifier(self, injection: Injection) -> None:
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline and not self._over.is_set():
            for p in psutil.process_iter(["uids"]):
                uids = p.info["uids"]
                if uids is not None and uids.real in self.verifier_uids:
                    with _suppressed():
                        p.suspend()
                        injection.at_s, t0 = time.time(), time.monotonic()
                        injection.detail = f"verifier pid {p.pid} stopped"
                        while p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                            if time.monotonic() - t0 > self.wait_s:
                                return
                            time.sleep(0.2)
                    if injection.at_s:
                        injection.recovery_s = round(time.monotonic() - t0, 2)
                        return
            time.sleep(0.05)
        injection.detail = "not injected: no verifier process ran"


class _suppressed:
    """psutil errors of a process that ended meanwhile end the wait quietly."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, psutil.Error)


def _engine_server(agent_pid: int) -> tuple[int, int] | None:
    """(pid, port) of the SGLang server a cell agent runs, None while it has none."""
    with _suppressed():
        for child in psutil.Process(agent_pid).children():
            argv = child.cmdline()
            if ENGINE_MODULE in argv and "--port" in argv:
                return child.pid, int(argv[argv.index("--port") + 1])
    return None


def _running_calls(port: int) -> float:
    """Requests running on the SGLang server at `port`, by its own gauge (0 while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2.0) as reply:
            text = reply.read().decode()
    except OSError:
        return 0.0
    gauges = [line for line in text.splitlines() if line.startswith("sglang:num_running_reqs{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in gauges)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2.0) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _serving(entry: ProcessEntry) -> bool:
    if entry.grpc_port:
        return grpc_health(entry.grpc_port, timeout_s=1.0) == "SERVING"
    port = entry.ports.get("client", 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def fault_report(events: list[Event], injections: list[Injection], steps: int) -> dict[str, Any]:
    """`{"run": <the run's invariants>, "faults": {label: {completed, lost, double_trained, double_applied,
    harness_errors, recovery_s, injected}}}`; violations and harness errors fall into the window of the last
    fault injected before them (`before_faults` when none was)."""
    check = check_events(events, steps)
    windows = sorted((i.at_s, i.fault.label()) for i in injections if i.at_s)
    rows: dict[str, dict[str, Any]] = {"before_faults": _row(check.completed)}
    for i in injections:
        rows[i.fault.label()] = {
            **_row(check.completed),
            "injected": bool(i.at_s),
            "recovery_s": i.recovery_s,
            **({"detail": i.detail} if i.detail else {}),
        }

    def window(t: float) -> str:
        label = "before_faults"
        for at_s, name in windows:
            if t >= at_s:
                label = name
        return label

    for v in check.violations:
        row = rows[window(v.time_s)]
        if v.kind in row:
            row[v.kind] += 1
    for r in events:
        if r["type"] == "gyre.v1.ExecutionTerminated" and r["event"].get("reason") not in _OK_ENDINGS:
            rows[window(float(r["time_s"]))]["harness_errors"] += 1
    return {"run": check.summary(), "faults": rows}


def _row(completed: bool) -> dict[str, Any]:
    return {"completed": completed, "lost": 0, "double_trained": 0, "double_applied": 0, "harness_errors": 0}


def kill_whole_run(run_dir: Path) -> list[ProcessId]:
    """SIGKILL the run's supervisor and every process under it at the same moment (a crash of the whole
    run, disks kept); the processes killed."""
    state = StackState.load(run_dir.resolve())
    if state is None or not state.supervisor_alive():
        raise RuntimeError(f"no live supervisor recorded in {run_dir}/stack.json")
    return crash_tree(state.supervisor_pid)
