"""Run the whole system for a number of optimizer steps and write its report.

    run = DemoRun(config, steps=12)
    summary = run.execute(progress=print)     # starts the stack, trains, shuts down, reports

The stack is the one `gyre up` starts (NATS, Redis, every service, K cell agents), tied to this process:
a process that exits is restarted by the stack's supervisor; if the supervisor gives up, the run fails.
SIGTERM or SIGINT stops the run within the stack's stop bound (20 s by default) whatever the demo is doing
(app/stack/signals.py), then exits with 128 + signum; if this process is killed, the supervisor stops the
run by itself. Progress comes from the scheduler's `GetState`; the report from the run's stored events
(app/demo/report.py). `DemoRun.resuming(run_dir)` continues a run whose processes all died
(`gyre resume RUN`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from app.demo.events import read_events
from app.demo.heldout import HeldOut
from app.demo.memory import RedisMemory
from app.demo.report import RunFacts, plot_reward_staleness, summarize, timeline
from app.stack.launcher import StackError, StackState, down_state, up
from app.stack.resume import resume_stack
from app.stack.signals import StopSignals
from gyre.bus import login_url
from gyre.config import GyreConfig, load_config
from gyre.rpc import call_while_restarting, sync_channel
from gyre.tasks import TaskSet
from gyre.v1 import common_pb2, proxy_pb2, proxy_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

T = TypeVar("T")
Progress = Callable[[scheduler_pb2.SchedulerState, float], None]


class DemoRun:
    def __init__(
        self, config: GyreConfig, steps: int, drain_timeout_s: float = 120.0, resume: bool = False
    ) -> None:
        self.config = config.model_copy(deep=True)
        self.config.scheduler.max_steps = steps
        self.steps = steps
        self.drain_timeout_s = drain_timeout_s
        self.resume = resume
        self._stop = StopSignals()
        self.held_out = HeldOut(self.config, steps, self.config.run.path)
        self._memory: RedisMemory | None = None
        self._stop_reason = "max_steps"
        """Why training ended: `max_steps`, or the reason the scheduler stopped the run itself."""

    @classmethod
    def resuming(cls, run_dir: Path, drain_timeout_s: float = 120.0) -> DemoRun:
        """The run under `run_dir` (its resolved config.yaml), continued after every process of it died
        (app/stack/resume.py): to the step count it was started with."""
        config = load_config(run_dir / "config.yaml")
        return cls(
            config, steps=config.scheduler.max_steps or 1, drain_timeout_s=drain_timeout_s, resume=True
        )

    @property
    def run_dir(self) -> Path:
        return self.config.run.path

    def execute(self, progress: Progress | None = None, start_timeout_s: float = 120.0) -> dict[str, Any]:
        t0 = time.monotonic()
        # Every cell serves once its engine does: a launched SGLang may take engine_ready_timeout_s to start.
        start_timeout_s = max(start_timeout_s, self.config.cell_agent.engine_ready_timeout_s)
        with StopSignals() as stop:
            self._stop = stop
            try:
                if self.resume:
                    state = resume_stack(self.run_dir, wait_s=start_timeout_s, attached=True, stop=stop.event)
                else:
                    state = up(self.config, wait_s=start_timeout_s, attached=True, stop=stop.event)
            except StackError:
                if stop.event.is_set():
                    raise SystemExit(stop.exit_code) from None
                raise
            stop.on_stop = lambda: down_state(state)
            try:
                summary = self._run(state, progress, t0)
            except Exception:
                if stop.event.is_set():  # the teardown under way broke what the demo was waiting on
                    raise SystemExit(stop.exit_code) from None
                raise
            finally:
                if not stop.teardown_started:
                    down_state(state)
        if self.held_out.steps:  # with the stack down: the evaluation has the CPUs to itself
            summary["eval_by_step"] = self.held_out.evaluate()
            summary["held_out"] = self.held_out.tasks
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _run(self, state: StackState, progress: Progress | None, t0: float) -> dict[str, Any]:
        resolved = load_config(Path(state.config_path))
        host = resolved.run.peer_host("scheduler")
        with (
            sync_channel(f"{host}:{resolved.scheduler.port}") as sch_ch,
            sync_channel(f"{resolved.run.peer_host('proxy')}:{resolved.proxy.port}") as proxy_ch,
        ):
            scheduler = scheduler_pb2_grpc.SchedulerStub(sch_ch)
            proxy = proxy_pb2_grpc.ProxyStub(proxy_ch)
            self._memory = RedisMemory(resolved.redis.url or "", resolved.redis.login_for("cli"))
            try:
                self._train(scheduler, state, progress, t0)
            finally:
                self._memory.close()
            self._retrying(
                lambda: scheduler.Shutdown(scheduler_pb2.ShutdownRequest(cancel_running=True), timeout=120),
                state,
            )
            self._settle(scheduler, state)
            stats = self._retrying(lambda: proxy.GetStats(proxy_pb2.GetStatsRequest(), timeout=30), state)
        events = asyncio.run(
            read_events(login_url(resolved.nats.url or "", resolved.nats.login_for("cli")), resolved.run.id)
        )
        return self._report(events, stats, time.monotonic() - t0)

    def _train(
        self,
        scheduler: scheduler_pb2_grpc.SchedulerStub,
        stack: StackState,
        progress: Progress | None,
        t0: float,
    ) -> None:
        while True:
            self._check_alive(stack)
            st = self._state(scheduler, stack)
            if progress is not None:
                progress(st, time.monotonic() - t0)
            self.held_out.keep(st.published_version)
            if self._memory is not None:
                self._memory.sample(st.steps)
            if st.steps >= self.steps:
                return
            if st.stop_reason:  # the scheduler stopped the run itself (scheduler.mismatch_gate)
                self._stop_reason = st.stop_reason
                return
            self._pause(1.0)

    def _state(
        self, scheduler: scheduler_pb2_grpc.SchedulerStub, stack: StackState
    ) -> scheduler_pb2.SchedulerState:
        return self._retrying(lambda: scheduler.GetState(scheduler_pb2.GetStateRequest(), timeout=30), stack)

    def _retrying(self, call: Callable[[], T], stack: StackState) -> T:
        """`call()`, asked again while its service restarts (the stack's supervisor restarts it)."""

        def wait() -> None:
            self._check_alive(stack)
            self._pause(0.5)

        return call_while_restarting(call, self.config.scheduler.peer_retry_s, wait)

    def _pause(self, seconds: float) -> None:
        """Sleep, or end the run at once when a stop was requested (the teardown runs on its own thread)."""
        if self._stop.event.wait(seconds):
            raise SystemExit(self._stop.exit_code)

    def _settle(self, scheduler: scheduler_pb2_grpc.SchedulerStub, stack: StackState) -> None:
        """Wait until every started execution terminated (cancelled ones included)."""
        deadline = time.monotonic() + self.drain_timeout_s
        while time.monotonic() < deadline:
            self._check_alive(stack)
            st = self._state(scheduler, stack)
            self.held_out.keep(st.published_version)
            if st.executions_in_flight == 0:
                self._pause(2.0)  # let the last evaluations land
                return
            self._pause(0.5)
        raise StackError(f"executions still running {self.drain_timeout_s:.0f} s after shutdown")

    def _save_events(self, events: list[Any]) -> None:
        """Every event of the run as JSON lines (`events.jsonl`), for inspection and tests."""
        with open(self.run_dir / "events.jsonl", "w") as f:
            for r in events:
                f.write(_event_line(r) + "\n")

    def _check_alive(self, stack: StackState) -> None:
        """The stack still runs: its supervisor restarts processes that exit, and stops the run when one is
        out of restarts (then its error is raised here)."""
        if self._stop.event.is_set():
            raise SystemExit(self._stop.exit_code)
        if not stack.supervisor_alive():
            if self._stop.event.is_set():  # a signal's teardown stopped it after the check above
                raise SystemExit(self._stop.exit_code)
            final = StackState.load(Path(stack.run_dir))
            reason = final.error if final is not None and final.error else "the stack's supervisor exited"
            raise StackError(f"{reason} (logs in {stack.run_dir}/logs)")

    def _report(self, events: list[Any], stats: proxy_pb2.ProxyStats, wall_s: float) -> dict[str, Any]:
        c = self.config.scheduler
        facts = RunFacts(
            mode=c.mode,
            phi=c.phi,
            mu=c.mu,
            num_cells=c.num_cells,
            group_size=c.group_size,
            cell_capacity=c.cell_capacity,
            separate_pool_capacity=c.separate_pool_capacity,
            reroutes=stats.reroutes,
            kv_migrated_tokens=stats.kv_migrated_tokens,
            harness_errors_during_transitions=stats.errors_during_transitions,
            wall_s=wall_s,
            recorded_calls=stats.recorded_calls,
            history_mismatches=stats.history_mismatches,
            side_calls=stats.side_calls,
            refused_calls=dict(stats.refused_calls),
            refusal_messages=dict(stats.refusal_messages),
            chat_template=_chat_template(stats.chat_template),
            extra={
                "run_id": self.config.run.id,
                "run_dir": str(self.run_dir),
                "stop_reason": self._stop_reason,
                # tasks whose verifier ran where their harness ran (the opt-in the run allowed)
                "same_container_verifier_tasks": TaskSet.from_section(
                    self.config.tasks
                ).same_container_tasks(),
            },
        )
        self._save_events(events)
        summary = summarize(events, facts)
        from gyre.metrics.timeline import plot_timeline

        title = f"Gyre demo, {c.mode} (K={c.num_cells}, φ={c.phi}, μ={c.mu}): {summary['steps']} steps"
        summary["role_timeline_png"] = str(
            plot_timeline(timeline(events, facts, title), self.run_dir / "role_timeline.png")
        )
        summary["reward_staleness_png"] = str(
            plot_reward_staleness(summary, self.run_dir / "reward_staleness.png")
        )
        if self._memory is not None:
            summary.update(self._memory.report(summary["steps"]))
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def _chat_template(info: proxy_pb2.ChatTemplateInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"name": info.name, "source": info.source}
    if info.source == "registry":
        out.update(family=info.family, replaced=info.replaced, replaced_breaks=list(info.replaced_breaks))
    return out


def _event_line(r: Any) -> str:
    from google.protobuf import json_format

    return json.dumps(
        {
            "subject": r.subject,
            "time_s": r.time_s,
            "type": r.event.DESCRIPTOR.full_name,
            "event": json_format.MessageToDict(r.event),
        }
    )


def role_names(st: scheduler_pb2.SchedulerState) -> str:
    short = {
        common_pb2.CELL_ROLE_ROLLOUT: "R",
        common_pb2.CELL_ROLE_TRAINING: "T",
        common_pb2.CELL_ROLE_DRAINING: "D",
    }
    return "".join(short.get(c.role, "?") for c in st.cells)
