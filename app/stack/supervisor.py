"""The supervisor of a local-stack run: starts NATS, Redis and every service, restarts what exits, stops all.

    python -m app.stack.supervisor --config runs/<run>/config.yaml --servers nats,redis --wait-s 30

`gyre up` and `gyre demo` start it (app/stack/launcher.py) and read its progress from `stack.json`. It
is the parent of every process of the run: each child gets SIGTERM from the kernel if the supervisor dies
(PR_SET_PDEATHSIG), orphans of its children become its own (PR_SET_CHILD_SUBREAPER). Attached to a
foreground `gyre up` / `gyre demo`, it gets SIGTERM itself when that process dies.

- Start: servers one by one (each ready before the next), then every service at once, then wait until
  each answers SERVING on grpc.health.v1. Any exit or timeout here fails the start: everything started is
  stopped (no half-started stacks) and `stack.json` keeps the error.
- Run: a process that exits is restarted on the same ports and data directories after a backoff, within
  a restart budget (`run.supervisor`, app/stack/restarts.py); each exit is published as `ProcessExited`
  (`gyre.<run>.stack.process_exited`) and shown by `gyre status`. Out of budget, the run is stopped —
  except for a satellite's cell agent (`cell_agent-K`, K > 0; cell 0 is the core): that cell is lost for
  good, its `ProcessExited` (gave_up) tells the scheduler to remove it from the pool, and the run goes on.
- Departures: a satellite given notice (`gyre cell drain ID`) is drained and removed from the pool by the
  scheduler; once its `GetState` shows the cell GONE (polled every second, app/stack/departures.py), its
  agent is stopped here as planned (SIGTERM, then SIGKILL after `stop_grace_s`): state `left`, no restart,
  no `ProcessExited`, the run goes on.
- Stop (SIGTERM, SIGINT, SIGHUP): SIGTERM to every service at once, SIGKILL of what is left after
  `stop_grace_s`; then NATS and Redis likewise; then whatever descendants remain. Within `stop_bound_s`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from grpc_health.v1 import health_pb2

from app.stack.departures import POLL_S, gone_cells, satellite_cell
from app.stack.events import ExitPublisher
from app.stack.health import grpc_health_async, last_error, tail
from app.stack.restarts import RestartHistory
from app.stack.servers import ServerSpec, launch, nats_spec, redis_spec, wait_ready
from app.stack.state import ProcessEntry, StackState
from gyre.config import GyreConfig, load_config
from gyre.lifecycle import STOP_SIGNALS, hold_grpc_aio, install_signal_handlers
from gyre.log import configure_logging, get_logger
from gyre.procs import ProcessId, become_subreaper, describe_exit, die_with_parent, stop_processes
from gyre.sandbox import SandboxError
from gyre.sandbox.host import remove_run_sandboxes

log = get_logger("app.stack.supervisor")

SERVICES: tuple[str, ...] = ("scheduler", "proxy", "runner", "evaluator", "packer", "cell_agent")


class StackStartFailed(RuntimeError):
    """The stack could not come up; the message names the process and shows its last log lines."""


@dataclass(slots=True)
class Member:
    """One supervised process: how to start it, its live `Popen`, its restart history."""

    entry: ProcessEntry
    argv: list[str]
    server: ServerSpec | None = None
    proc: subprocess.Popen[bytes] | None = None
    history: RestartHistory = field(default_factory=RestartHistory)
    restart_at_s: float = 0.0


class StackSupervisor:
    """Owns every process of one run (see the module docstring)."""

    def __init__(self, config: GyreConfig, config_path: Path, servers: set[str], wait_s: float) -> None:
        self.config = config
        self.policy = config.run.supervisor
        self.run_dir = config.run.path.resolve()
        self.wait_s = wait_s
        me = ProcessId.of(os.getpid())
        assert me is not None
        self.state = StackState(
            config.run.id,
            str(self.run_dir),
            str(config_path),
            supervisor_pid=me.pid,
            supervisor_started=me.started,
            stop_bound_s=self.policy.stop_bound_s,
        )
        self.members = [*self._server_members(servers), *self._service_members()]
        self.state.processes = [m.entry for m in self.members]
        self.stop_requested = asyncio.Event()
        self.gave_up = ""
        self.publisher = ExitPublisher(config)

    # -- plan --------------------------------------------------------------------------------------
    def _server_members(self, servers: set[str]) -> list[Member]:
        c, logs, creds = self.config, self.run_dir / "logs", self.run_dir / "credentials"
        specs: list[ServerSpec] = []
        if "nats" in servers:
            users = creds / "nats-users.json" if c.nats.credentials_file else None
            specs.append(
                nats_spec(
                    self.run_dir / "nats",
                    c.nats.port,
                    c.nats.monitor_port,
                    logs / "nats.log",
                    users,
                    c.nats.sync_interval_s,
                )
            )
        if "redis" in servers:
            acl = creds / "redis.acl" if c.redis.credentials_file else None
            specs.append(
                redis_spec(
                    self.run_dir / "redis",
                    c.redis.port,
                    c.redis.appendonly,
                    logs / "redis.log",
                    acl,
                    c.redis.appendfsync,
                )
            )
        return [
            Member(
                ProcessEntry(s.name, 0, 0, {"client": s.port, **s.extra_ports}, str(s.log_file)), s.argv, s
            )
            for s in specs
        ]

    def _service_members(self) -> list[Member]:
        members = []
        for name in SERVICES:
            if name == "cell_agent":
                plan = [(f"cell_agent-{k}", k, port) for k, port in enumerate(self.config.cell_agent.ports)]
            else:
                plan = [(name, None, int(getattr(self.config, name).port))]
            for label, instance, port in plan:
                argv = [sys.executable, "-m", f"services.{name}", "--config", self.state.config_path]
                if instance is not None:
                    argv += ["--instance", str(instance)]
                log_path = str(self.run_dir / "logs" / f"{label}.log")
                members.append(Member(ProcessEntry(label, 0, port, {}, log_path), argv))
        return members

    # -- processes ---------------------------------------------------------------------------------
    def _spawn(self, m: Member) -> None:
        if m.server is not None:
            m.proc = launch(m.server, preexec_fn=die_with_parent())
        else:
            with open(m.entry.log, "ab") as out:
                m.proc = subprocess.Popen(
                    m.argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    preexec_fn=die_with_parent(),
                )
        started = ProcessId.of(m.proc.pid)
        m.entry.pid, m.entry.started, m.entry.state = (
            m.proc.pid,
            started.started if started else 0.0,
            "running",
        )

    def _save(self) -> None:
        self.state.save()

    # -- run ---------------------------------------------------------------------------------------
    async def run(self) -> int:
        become_subreaper()
        install_signal_handlers(self.stop_requested, (*STOP_SIGNALS, signal.SIGHUP))
        self._save()
        try:
            await self._start()
        except StackStartFailed as e:
            self.state.phase, self.state.error = "failed", str(e)
            log.error("stack_start_failed", error=str(e))
            await self._stop_all()
            return 1
        if self.stop_requested.is_set():
            await self._stop_all()
            StackState.path(self.run_dir).unlink(missing_ok=True)
            return 0
        self.state.phase = "serving"
        self._save()
        log.info("stack_serving", processes=len(self.members))
        publisher = asyncio.create_task(self.publisher.run(), name="exit-publisher")
        departures = asyncio.create_task(self._watch_departures(), name="departures")
        await self._watch()
        departures.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await departures
        await self._stop_all(before_servers=lambda: self.publisher.close(publisher))
        if self.gave_up:
            self.state.phase, self.state.error = "failed", self.gave_up
            self._save()
            return 1
        StackState.path(self.run_dir).unlink(missing_ok=True)
        return 0

    async def _start(self) -> None:
        supervisor_login = self.config.redis.login_for("supervisor")
        for m in self.members:
            if m.server is None or self.stop_requested.is_set():
                continue
            self._spawn(m)
            self._save()
            try:
                await asyncio.to_thread(
                    wait_ready, m.server, 15.0, supervisor_login if m.server.name == "redis" else None
                )
            except TimeoutError as e:
                raise StackStartFailed(f"{m.entry.name}: {e}; last log lines:\n{tail(m.entry.log)}") from None
        if self.stop_requested.is_set():
            return
        for m in self.members:
            if m.server is None:
                self._spawn(m)
        self._save()
        await self._wait_serving()

    async def _wait_serving(self) -> None:
        deadline = time.monotonic() + self.wait_s
        waiting = [m for m in self.members if m.server is None]
        while waiting and not self.stop_requested.is_set():
            for m in list(waiting):
                assert m.proc is not None
                if m.proc.poll() is not None:
                    raise StackStartFailed(
                        f"{m.entry.name} exited during start-up; last log lines:\n{tail(m.entry.log)}"
                    )
                if await grpc_health_async(m.entry.grpc_port, 0.5) == health_pb2.HealthCheckResponse.SERVING:
                    waiting.remove(m)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(m.entry.name for m in waiting)
                raise StackStartFailed(
                    f"not SERVING after {self.wait_s:.0f} s: {names}; last log lines of "
                    f"{waiting[0].entry.name}:\n{tail(waiting[0].entry.log)}"
                )
            if waiting:
                await asyncio.sleep(0.1)

    async def _watch(self) -> None:
        while not self.stop_requested.is_set() and not self.gave_up:
            now = time.monotonic()
            for m in self.members:
                if m.entry.state == "running" and m.proc is not None and m.proc.poll() is not None:
                    self._on_exit(m, now)
                elif m.entry.state == "restarting" and now >= m.restart_at_s:
                    self._spawn(m)
                    log.info(
                        "process_restarted",
                        process=m.entry.name,
                        pid=m.entry.pid,
                        restarts=m.entry.num_restarts,
                    )
                    self._save()
            self._reap_orphans()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_requested.wait(), timeout=0.2)

    def _on_exit(self, m: Member, now_s: float) -> None:
        assert m.proc is not None
        exit_code, sig, reason = describe_exit(m.proc.returncode)
        decision = m.history.on_exit(now_s, self.policy)
        m.entry.last_exit = reason
        if decision.restart:
            m.entry.state, m.restart_at_s = "restarting", now_s + decision.delay_s
            m.entry.num_restarts += 1
            log.warning(
                "process_exited",
                process=m.entry.name,
                pid=m.entry.pid,
                reason=reason,
                restart_in_s=decision.delay_s,
                restarts_in_window=decision.num_restarts,
            )
        elif _is_satellite_agent(m.entry.name):
            m.entry.state = "lost"
            log.error("cell_lost", process=m.entry.name, pid=m.entry.pid, reason=reason)
        else:
            m.entry.state = "gave_up"
            self.gave_up = (
                f"{m.entry.name} {reason}; restart budget spent ({self.policy.max_restarts} restarts "
                f"within {self.policy.restart_window_s:g} s): the run was stopped"
            )
            if error := last_error(m.entry.log):
                self.gave_up += f"; its last error: {error}"
            log.error("process_gave_up", process=m.entry.name, pid=m.entry.pid, reason=reason)
        self.publisher.add(m.entry.name, m.entry.pid, exit_code, sig, reason, decision)
        self._save()

    async def _watch_departures(self) -> None:
        """Stop the agent of each satellite the scheduler removed from the pool after a notice."""
        scheduler = next((m for m in self.members if m.entry.name == "scheduler"), None)
        if scheduler is None:
            return
        while True:
            await asyncio.sleep(POLL_S)
            gone = await gone_cells(scheduler.entry.grpc_port)
            for m in self.members:
                if (
                    gone
                    and satellite_cell(m.entry.name) in gone
                    and m.entry.state in ("running", "restarting")
                ):
                    await self._depart(m)

    async def _depart(self, m: Member) -> None:
        """A planned departure: the cell left the pool, so its agent stops and is not restarted."""
        m.entry.state = "left"
        self._save()
        if m.proc is not None and m.proc.poll() is None:
            # stop_processes reaps it, so its Popen's returncode no longer tells how it ended: its report does
            report = await asyncio.to_thread(stop_processes, [m.entry.process_id], self.policy.stop_grace_s)
            m.entry.last_exit = (
                f"killed by SIGKILL {self.policy.stop_grace_s:g} s after SIGTERM (planned departure)"
                if m.entry.pid in report.killed
                else "stopped by SIGTERM (planned departure)"
            )
        log.info("cell_left", process=m.entry.name, pid=m.entry.pid, reason=m.entry.last_exit)
        self._save()

    def _reap_orphans(self) -> None:
        """Adopted orphans (this process is a subreaper) become zombies here: collect them."""
        ours = {m.proc.pid for m in self.members if m.proc is not None}
        for child in psutil.Process().children():
            if child.pid not in ours:
                with contextlib.suppress(ChildProcessError, psutil.Error):
                    if child.status() == psutil.STATUS_ZOMBIE:
                        os.waitpid(child.pid, os.WNOHANG)

    async def _stop_all(self, before_servers: Callable[[], Awaitable[None]] | None = None) -> None:
        """Services at once (grace, then SIGKILL of their trees), then the servers, then any descendant left."""
        t0 = time.monotonic()
        if self.state.phase != "failed":
            self.state.phase = "stopping"
        self._save()
        log.info("stack_stopping")
        names = {m.entry.pid: m.entry.name for m in self.members}
        services = [m.entry.process_id for m in self.members if m.server is None and m.proc is not None]
        servers = [
            m.entry.process_id for m in reversed(self.members) if m.server is not None and m.proc is not None
        ]
        for what, ids, grace_s in (
            ("services", services, self.policy.stop_grace_s),
            ("servers", servers, self.policy.server_stop_grace_s),
        ):
            if what == "servers" and before_servers is not None:
                await before_servers()
            report = await asyncio.to_thread(stop_processes, ids, grace_s)
            log.info(
                "stack_stopped_" + what,
                after_s=round(time.monotonic() - t0, 2),
                stopped=report.num_stopped,
                killed=[names.get(pid, pid) for pid in report.killed],
                left=report.left,
            )
        rest = [ProcessId(p.pid, 0.0) for p in psutil.Process().children(recursive=True)]
        if rest:
            report = await asyncio.to_thread(stop_processes, rest, 0.5)
            log.info(
                "stack_stopped_orphans", stopped=report.num_stopped, killed=report.killed, left=report.left
            )
        for m in self.members:
            if m.proc is not None:
                m.proc.poll()
            m.entry.state = m.entry.state if m.entry.state in ("gave_up", "lost", "left") else "stopped"
        self._save()
        removed = await asyncio.to_thread(self._remove_sandboxes)
        log.info("stack_stopped", after_s=round(time.monotonic() - t0, 2), sandboxes_removed=removed)

    def _remove_sandboxes(self) -> int:
        """Every sandbox the run kept (its containers), once no service of the run is left to use them."""
        try:
            return remove_run_sandboxes(self.config)
        except (OSError, ValueError, SandboxError) as e:
            log.error("sandboxes_not_removed", error=str(e))
            return 0


def _is_satellite_agent(process: str) -> bool:
    """A satellite's cell agent: out of restarts, its cell leaves the pool and the run goes on (the core's,
    cell 0's, cannot be lost: the run stops)."""
    return satellite_cell(process) is not None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m app.stack.supervisor", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--config", type=Path, required=True, help="the run's resolved config (gyre up writes it)"
    )
    parser.add_argument("--servers", default="", help="servers to start: nats,redis (none when given URLs)")
    parser.add_argument(
        "--wait-s", type=float, default=30.0, help="seconds for every service to answer SERVING"
    )
    args = parser.parse_args(argv)
    config = load_config(args.config)
    configure_logging(config.log.format, config.log.level)
    hold_grpc_aio()  # health checks open and free a channel each: see its docstring
    servers = {s for s in args.servers.split(",") if s}
    supervisor = StackSupervisor(config, args.config.resolve(), servers, args.wait_s)
    raise SystemExit(asyncio.run(supervisor.run()))


if __name__ == "__main__":
    main()
