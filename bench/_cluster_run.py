"""One training run of `gyre bench cluster` on a compose project that is up: wait for health, train with
node-level faults, shut down, read the events, check the invariants, gather where traffic went.

    result = ClusterRun(project, run_dir, config, ports, steps=6, faults=["satellite-kill"]).execute(420)

The host reaches the stack only through the ports compose publishes on 127.0.0.1 (the scheduler's gRPC,
NATS and its monitoring port); everything between services goes between containers.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench._compose import ComposeProject
from gyre.demo.events import read_events
from gyre.demo.faults import Fault, Injection, fault_report
from gyre.demo.ledger import read_event_lines
from gyre.rpc import call_while_restarting, sync_channel
from gyre.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

SATELLITE, CORE = "cell-agent-2", "cell-agent-0"
PARTITION_S = 10.0


class ClusterRun:
    def __init__(
        self,
        project: ComposeProject,
        run_dir: Path,
        config: dict[str, Any],
        ports: dict[str, int],
        steps: int,
        faults: list[str],
    ) -> None:
        self.project = project
        self.run_dir = run_dir
        self.run_id = str(config["run"]["id"])
        self.services = ["nats", "redis", "scheduler", "proxy", "runner", "evaluator", "packer"] + [
            f"cell-agent-{k}" for k in range(int(config["scheduler"]["num_cells"]))
        ]
        self.ports = ports
        self.steps = steps
        self.faults = faults
        self.injections: list[Injection] = []
        self.state: scheduler_pb2.SchedulerState | None = None

    def execute(self, start_timeout_s: float) -> dict[str, Any]:
        ready = self.project.wait_healthy(self.services, start_timeout_s)
        print(f"[cluster] healthy: {ready}", file=sys.stderr, flush=True)
        channel = sync_channel(f"127.0.0.1:{self.ports['GYRE_SCHEDULER_PORT']}")
        scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
        injector = threading.Thread(target=self._inject_all, name="faults", daemon=True)
        t0 = time.monotonic()
        try:
            while True:
                self.state = self._retrying(
                    lambda: scheduler.GetState(scheduler_pb2.GetStateRequest(), timeout=30)
                )
                st = self.state
                print(
                    f"[cluster {time.monotonic() - t0:5.0f}s] step {st.steps}/{self.steps} "
                    f"faults {sum(bool(i.at_s) for i in self.injections)}/{len(self.faults)}",
                    file=sys.stderr,
                    flush=True,
                )
                if not injector.is_alive() and not self.injections and self.faults:
                    injector.start()
                if st.steps >= self.steps and not injector.is_alive():
                    break
                if time.monotonic() - t0 > 60 * (10 + 3 * self.steps):
                    raise TimeoutError(f"{self.steps} steps not reached; at {st.steps}")
                time.sleep(1.0)
            train_s = time.monotonic() - t0
            self._retrying(
                lambda: scheduler.Shutdown(scheduler_pb2.ShutdownRequest(cancel_running=True), timeout=120)
            )
            self._settle(scheduler)
            hosts = self._hosts()
        finally:
            channel.close()
        events_path = self._save_events()
        report = fault_report(read_event_lines(events_path), self.injections, self.steps)
        rows = report["faults"]
        total = {
            k: sum(int(r[k]) for r in rows.values()) for k in ("lost", "double_trained", "harness_errors")
        }
        return {
            "completed": report["run"].get("completed", False) if isinstance(report["run"], dict) else False,
            "steps": int(self.state.steps) if self.state is not None else 0,
            **total,
            "recovery_s": {i.fault.label(): i.recovery_s for i in self.injections},
            "faults": rows,
            "run": report["run"],
            "healthy_s": ready,
            "train_s": round(train_s, 1),
            **hosts,
        }

    # -- faults ----------------------------------------------------------------------------------
    def _inject_all(self) -> None:
        at_step = 0
        for name in self.faults:
            fault = Fault(name, at_step=at_step, when="training" if name == "core-kill" else "any", name=name)
            injection = Injection(fault)
            self.injections.append(injection)
            if not self._wait_for(fault, timeout_s=600):
                injection.detail = "not injected: its moment never came"
                continue
            try:
                self._inject(injection)
            except Exception as e:  # the report says what went wrong; the run goes on
                injection.detail = f"{type(e).__name__}: {e}"
            at_step = (self.state.steps if self.state is not None else 0) + (1 if name != "core-kill" else 0)

    def _wait_for(self, fault: Fault, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self.state
            if st is not None and self._moment(st, fault):
                return True
            time.sleep(0.2)
        return False

    def _moment(self, st: scheduler_pb2.SchedulerState, fault: Fault) -> bool:
        if not fault.at_step <= st.steps < self.steps:
            return False
        return fault.when != "training" or (
            bool(st.cells) and st.cells[0].role == common_pb2.CELL_ROLE_TRAINING
        )

    def _inject(self, injection: Injection) -> None:
        name = injection.fault.label()
        service = {"satellite-kill": SATELLITE, "satellite-partition": SATELLITE, "core-kill": CORE}.get(
            name, "redis"
        )
        before = self.project.containers()[service]
        injection.at_s = time.time()
        t0 = time.monotonic()
        if name.endswith("-kill"):
            self.project.kill(service)
            injection.detail = f"pid {before.pid} SIGKILLed"
        elif name == "satellite-partition":
            self.project.partition(service, PARTITION_S)
            t0 = time.monotonic()
            injection.detail = f"{service} ({before.ip}) off the network for {PARTITION_S:.0f} s"
        else:
            self.project.restart(service)
            injection.detail = "podman restart"
        injection.recovery_s = self._recovered(
            service, before.restarts if name.endswith("-kill") else None, t0
        )

    def _recovered(
        self, service: str, restarts_before: int | None, t0: float, timeout_s: float = 300
    ) -> float | None:
        while time.monotonic() - t0 < timeout_s:
            c = self.project.containers().get(service)
            restarted = restarts_before is None or (c is not None and c.restarts > restarts_before)
            if c is not None and c.state == "running" and restarted and self.project.healthcheck(service):
                return round(time.monotonic() - t0, 2)
            time.sleep(0.5)
        return None

    # -- after the run -----------------------------------------------------------------------------
    def _retrying(self, call: Any, timeout_s: float = 300) -> Any:
        return call_while_restarting(call, timeout_s, wait=lambda: time.sleep(0.5))

    def _settle(self, scheduler: scheduler_pb2_grpc.SchedulerStub, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self._retrying(lambda: scheduler.GetState(scheduler_pb2.GetStateRequest(), timeout=30))
            if st.executions_in_flight == 0:
                time.sleep(2.0)  # the last evaluations land
                return
            time.sleep(0.5)

    def _save_events(self) -> Path:
        from gyre.demo.run import _event_line

        events = asyncio.run(read_events(f"nats://127.0.0.1:{self.ports['GYRE_NATS_PORT']}", self.run_id))
        path = self.run_dir / "events.jsonl"
        with open(path, "w") as f:
            for r in events:
                f.write(_event_line(r) + "\n")
        return path

    def _hosts(self) -> dict[str, Any]:
        """Every container's address; the engines the scheduler hands the proxy and the addresses their
        names resolve to inside the network; the address each NATS client connected from (/connz)."""
        found = self.project.containers()
        hosts = {s: c.ip for s, c in sorted(found.items())}
        engines = {}
        if self.state is not None:
            for cell in self.state.cells:
                url = cell.engine.url
                if not url:
                    continue
                name = url.split("//", 1)[-1].rsplit(":", 1)[0]
                engines[url] = hosts.get(name, "")
        connz = json.loads(
            urllib.request.urlopen(
                f"http://127.0.0.1:{self.ports['GYRE_NATS_MONITOR_PORT']}/connz?limit=1024", timeout=10
            ).read()
        )
        clients = {str(c.get("name") or c["cid"]): str(c["ip"]) for c in connz.get("connections", [])}
        gyre_ips = {ip for s, ip in hosts.items() if s not in ("nats", "redis")}
        crossed = (
            len(set(hosts.values())) == len(hosts)
            and bool(engines)
            and all(ip and ip != hosts.get("proxy") for ip in engines.values())
            and bool(clients)
            and {ip for ip in clients.values()} <= gyre_ips
        )
        return {"hosts": hosts, "engines": engines, "nats_clients": clients, "crossed_hosts": crossed}
