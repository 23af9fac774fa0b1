"""One training run of `gyre bench kube` on pods that are played: wait for the cells, delete pods and play
them again mid-run, shut down, read the events, check the invariants; then the audit from the pods' volumes.

    result = KubeRun(play, run_dir, config, steps=2, faults=["cell-pod-delete"], tls_dir=tls).execute(420)
    result["audit"] = audit_kube_run(play, run_dir, config, model_dir, tls_dir, redis_image)

The host dials the scheduler and NATS through loopback port-forwards (bench/_kube_play.py) as the
deployment's `cli` identity; everything between services goes between the pods.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from app.demo.events import read_events
from app.demo.faults import Fault, Injection, fault_report
from app.demo.ledger import read_event_lines
from app.demo.report import execution_counts
from bench._cluster_run import retrying, settle
from bench._kube_play import KubePlay
from gyre import tls
from gyre.rpc import sync_channel
from gyre.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

FAULT_PODS = {"cell-pod-delete": "cell-agent-2.cell-agent", "core-pod-delete": "cell-agent-0.cell-agent"}


class KubeRun:
    def __init__(
        self,
        play: KubePlay,
        run_dir: Path,
        config: dict[str, Any],
        steps: int,
        faults: list[str],
        tls_dir: Path,
        stall_s: float = 600.0,
    ) -> None:
        self.play = play
        self.run_dir = run_dir
        self.run_id = str(config["run"]["id"])
        self.steps = steps
        self.faults = faults
        self.injections: list[Injection] = []
        self.state: scheduler_pb2.SchedulerState | None = None
        self.stall_s = stall_s
        """A run whose step count stands still this long (once it has started) is reported as stalled."""
        self.all_ready = False
        self.next_step_s: dict[str, float] = {}
        """Per fault: seconds from the deletion until the run's step count moved past where it stood."""
        """Every pod has passed its readiness probe: a fault waits for it, so it hits a running deployment."""
        tls.configure(tls.TlsFiles.under(tls_dir, "cli"))

    def execute(self, start_timeout_s: float) -> dict[str, Any]:
        t0 = time.monotonic()
        ready: dict[str, float] = {}
        pods = list(self.play.playable.pods)
        health = threading.Thread(
            target=lambda: ready.update(self.play.wait_healthy(pods, start_timeout_s, t0)), daemon=True
        )
        health.start()
        injector = threading.Thread(target=self._inject_all, name="faults", daemon=True)
        last_steps, last_progress = 0, time.monotonic()
        with self.play.forward("scheduler", 50051) as port, self.play.forward("nats", 4222) as nats_port:
            channel = sync_channel(f"127.0.0.1:{port}")
            scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
            try:
                while True:
                    self.state = retrying(
                        lambda: scheduler.GetState(scheduler_pb2.GetStateRequest(), timeout=30),
                        start_timeout_s,
                    )
                    st = self.state
                    print(
                        f"[kube {time.monotonic() - t0:5.0f}s] step {st.steps}/{self.steps} faults "
                        f"{sum(bool(i.at_s) for i in self.injections)}/{len(self.faults)} healthy {len(ready)}/"
                        f"{len(pods)}",
                        flush=True,
                        file=sys.stderr,
                    )
                    self.all_ready = len(ready) == len(pods)
                    if not injector.is_alive() and not self.injections and self.faults and st.cells:
                        injector.start()
                    done_injecting = not injector.is_alive() and (self.injections or not self.faults)
                    if st.steps >= self.steps and done_injecting and not health.is_alive():
                        break
                    if st.steps != last_steps:
                        last_steps, last_progress = st.steps, time.monotonic()
                    if st.steps and time.monotonic() - last_progress > self.stall_s:
                        raise TimeoutError(f"no step for {self.stall_s:.0f} s at step {st.steps}")
                    if time.monotonic() - t0 > start_timeout_s + 60 * (5 + 3 * self.steps):
                        raise TimeoutError(f"{self.steps} steps not reached; at {st.steps}")
                    time.sleep(1.0)
                if len(ready) < len(pods):
                    raise TimeoutError(f"not healthy: {sorted(set(pods) - set(ready))}")
                train_s = time.monotonic() - t0
                retrying(
                    lambda: scheduler.Shutdown(
                        scheduler_pb2.ShutdownRequest(cancel_running=True), timeout=120
                    )
                )
                settle(scheduler)
            finally:
                channel.close()
            events_path, executions = self._save_events(f"nats://127.0.0.1:{nats_port}")
        report = fault_report(read_event_lines(events_path), self.injections, self.steps)
        rows = report["faults"]
        for name, seconds in self.next_step_s.items():
            rows[name]["next_step_s"] = seconds
        total = {
            k: sum(int(r[k]) for r in rows.values()) for k in ("lost", "double_trained", "harness_errors")
        }
        run = report["run"]
        pods_seen = self.play.describe()
        for pod, seconds in ready.items():
            pods_seen[pod]["healthy_s"] = seconds
        return {
            "completed": bool(run.get("completed", False)) if isinstance(run, dict) else False,
            "steps": int(self.state.steps) if self.state is not None else 0,
            **total,
            "executions": executions,
            "pods": pods_seen,
            "faults": rows,
            "run": run,
            "train_s": round(train_s, 1),
        }

    def stalled(self, error: Exception) -> dict[str, Any]:
        """The result of a run that stopped making progress: where it stood and what was injected."""
        return {
            "completed": False,
            "error": str(error),
            "steps": int(self.state.steps) if self.state is not None else 0,
            "faults": {
                i.fault.label(): {
                    "injected": bool(i.at_s),
                    "recovery_s": i.recovery_s,
                    "detail": i.detail,
                    **(
                        {"next_step_s": self.next_step_s[i.fault.label()]}
                        if i.fault.label() in self.next_step_s
                        else {}
                    ),
                }
                for i in self.injections
            },
        }

    # -- faults ----------------------------------------------------------------------------------
    def _inject_all(self) -> None:
        at_step = 0
        for name in self.faults:
            when = "training" if name == "core-pod-delete" else "any"
            injection = Injection(Fault(name, at_step=at_step, when=when, name=name))
            self.injections.append(injection)
            if not self._wait_for(injection.fault, timeout_s=600):
                injection.detail = "not injected: its moment never came"
                continue
            try:
                self._delete_and_play(injection, FAULT_PODS[name])
            except Exception as e:  # the report says what went wrong; the run goes on
                injection.detail = f"{type(e).__name__}: {e}"
            at_step = (self.state.steps if self.state is not None else 0) + 1

    def _wait_for(self, fault: Fault, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self.state
            if st is not None and st.steps >= self.steps:
                return False  # the run is over: its moment cannot come
            if st is not None and fault.at_step <= st.steps and self.all_ready:
                training = bool(st.cells) and st.cells[0].role == common_pb2.CELL_ROLE_TRAINING
                if fault.when != "training" or training:
                    return True
            time.sleep(0.2)
        return False

    def _delete_and_play(self, injection: Injection, pod: str) -> None:
        injection.at_s = time.time()
        t0 = time.monotonic()
        old_ip = self.play.ip(pod)
        self.play.delete(pod)
        self.play.play(pod)
        injection.detail = f"pod {pod} ({old_ip}) deleted and played again as {self.play.ip(pod)}"
        steps_before = self.state.steps if self.state is not None else 0
        ready = self.play.wait_healthy([pod], timeout_s=300, t0=t0)
        injection.recovery_s = ready[pod]
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # the run's own recovery: its next step after the deletion
            st = self.state
            if st is not None and (st.steps > steps_before or st.steps >= self.steps):
                self.next_step_s[injection.fault.label()] = round(time.monotonic() - t0, 1)
                return
            time.sleep(0.2)

    # -- after the run -----------------------------------------------------------------------------
    def _save_events(self, nats_url: str) -> tuple[Path, dict[str, int]]:
        """The run's events as `gyre up` writes them (`events.jsonl`) and the report's execution counts from
        them (`summary.json`), which the audit compares with its own accounting."""
        from app.demo.run import _event_line

        events = asyncio.run(read_events(nats_url, self.run_id))
        path = self.run_dir / "events.jsonl"
        with open(path, "w") as f:
            for r in events:
                f.write(_event_line(r) + "\n")
        executions = execution_counts(events)
        (self.run_dir / "summary.json").write_text(json.dumps({"executions": executions}, indent=2))
        return path, executions


def audit_kube_run(
    play: KubePlay, run_dir: Path, config: dict[str, Any], model_dir: Path, tls_dir: Path, redis_image: str
) -> dict[str, Any]:
    """Stop the pods (every file final), gather the run from their volumes under the compose volumes' names
    (bench/_cluster_audit.py), audit it; the report as JSON with where the gathered run is."""
    from app.audit import AuditInputError, audit_run
    from bench._cluster_audit import gather_run, served_redis

    for pod in play.playable.pods:
        play.podman("pod", "stop", "-t", "20", pod, check=False)
    p = play.prefix
    volumes = {
        "scheduler": f"{p}-scheduler-home",
        "packer": f"{p}-packer-home",
        "workspaces": f"{p}-workspaces",
        "cell-agent-0": f"{p}-data-cell-agent-0",
        "redis-data": f"{p}-data-redis-0",
    }
    trees = {label: play.volume_path(name) for label, name in volumes.items()}
    reports = [run_dir / "events.jsonl", run_dir / "summary.json"]
    run_id = str(config["run"]["id"])
    gathered = gather_run(trees, run_id, run_dir / "gathered", reports, config, model_dir, tls_dir)
    try:
        with served_redis(p, play.env, redis_image, gathered / "redis") as url:
            report = audit_run(gathered, redis_url=url)
    except AuditInputError as e:
        return {"ok": False, "defects": [f"input: {e}"], "run_dir": str(gathered)}
    return {**report.to_json(), "run_dir": str(gathered)}
