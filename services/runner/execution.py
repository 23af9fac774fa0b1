"""One execution's lifecycle in the runner, from start request to termination report.

    start request → claim (Redis; the request is acknowledged) → resolve the task (and its image) →
    workspace from the task template → proxy credentials (OpenExecution) → launch the sandbox →
    ExecutionStarted, counter p → wait under the harness deadline (SIGTERM, grace, SIGKILL on timeout,
    cancel or overall budget) → sweep → (a container's workspace copied out) → preserve the workspace
    (root-owned, content hash) → CloseExecution → ExecutionTerminated, counter f → forget

A task written for an environment (a Harbor task) gets its working directory and `/logs/agent`
as bind mounts, or its prompt rewritten to the host paths (gyre/sandbox/task_paths.py); in a container
(the `container` launcher) its image's own paths, and the container stays for the verifier.

A start that can never run (unknown or malformed task, workspace or sandbox failure, no proxy)
terminates as INFRA_FAILURE with no workspace reference: the evaluator turns it into a placeholder; one
whose task's environment cannot be had (its image, the container engine) as ENVIRONMENT_UNAVAILABLE,
which the evaluator excludes. Every
report is idempotent (event id `exec.terminated:<execution>`, counter tokens), so a runner that
crashes mid-report and reconciles reports again without double counting.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

from prometheus_client import CollectorRegistry

from gyre.bus import EventBus
from gyre.log import bind_context, get_logger
from gyre.sandbox import (
    EnvironmentUnavailableError,
    NetworkPolicy,
    SandboxError,
    SandboxHandle,
    SandboxImage,
    SandboxLauncher,
    SandboxLimits,
    SandboxOutcome,
    SandboxSpec,
)
from gyre.sandbox.host import BASE_PATH
from gyre.sandbox.launchers.base import LABEL_EXECUTION, LABEL_ROLE, CopyBudget, CopyOutLimit
from gyre.sandbox.task_paths import HarnessLayout, agent_logs_of, container_layout, harness_layout
from gyre.sandbox.workspace import content_hash, create_workspace, preserve
from gyre.store import CounterInvariantError, Counters
from gyre.tasks import Task, TaskError, TaskRegistry
from gyre.tasks.dockerfile import DEFAULT_WORKDIR
from gyre.tasks.harbor import AGENT_LOGS_DIR
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from gyre.v1.proxy_pb2 import OpenExecutionResponse as Credentials
from services.runner.harnesses import HarnessCommand, Launch
from services.runner.metrics import RunnerMetrics, reason_label
from services.runner.ownership import OwnedExecution, Ownership
from services.runner.proxy_client import ProxyClient, ProxyUnavailableError

log = get_logger("gyre.runner")
Reason: TypeAlias = cm.TerminationReason.ValueType
Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[Any]"]


class Slots:
    """The concurrency bound: a start waits for a free slot; adopted executions take one regardless."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self._changed = asyncio.Condition()

    async def acquire(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used < self.size)
            self.used += 1

    def take(self) -> None:
        self.used += 1

    async def release(self) -> None:
        async with self._changed:
            self.used -= 1
            assert self.used >= 0, "slot released twice"
            self._changed.notify()


@dataclass(frozen=True, slots=True)
class PendingStart:
    """A claimed start request whose sandbox is not launched yet."""

    request: ev.ExecutionStartRequested
    owned: OwnedExecution
    task: Task | None
    error: str
    """Why there is no task (reported when the start completes)."""
    began: float


@dataclass(slots=True)
class RunningExecution:
    owned: OwnedExecution
    handle: SandboxHandle
    cancel: asyncio.Event = field(default_factory=asyncio.Event)


class StartFailed(Exception):
    """A step of a start failed; the message says which and why (the execution never started).
    `environment`: the task's environment could not be had (excluded, not a placeholder)."""

    def __init__(self, detail: str, environment: bool = False) -> None:
        super().__init__(detail)
        self.environment = environment


HARNESS_REASONS = frozenset(
    {cm.TERMINATION_REASON_COMPLETED, cm.TERMINATION_REASON_FAILED, cm.TERMINATION_REASON_HARNESS_TIMEOUT}
)
"""How a harness ends by itself (or past its own time limit): a copy-out past a cap turns them FAILED."""


def _measure(roots: list[Path], budget: CopyBudget) -> None:
    """Count every entry and regular file's bytes under `roots` (symlinks not followed) against `budget`."""
    for root in roots:
        if not root.is_dir():
            continue
        for dirpath, dirs, files in os.walk(root):
            for name in dirs + files:
                budget.add_file()
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    budget.add_bytes(st.st_size)


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def reason_of(outcome: SandboxOutcome) -> Reason:
    """How a harness that ended on its own ended (a stop by the runner has its own reason)."""
    if not outcome.started:
        return cm.TERMINATION_REASON_INFRA_FAILURE
    return cm.TERMINATION_REASON_COMPLETED if outcome.exit_code == 0 else cm.TERMINATION_REASON_FAILED


class ExecutionController:
    """Starts, watches, adopts, cancels and reports executions of one runner."""

    def __init__(
        self,
        *,
        runner_id: str,
        bus: EventBus,
        counters: Counters,
        ownership: Ownership,
        proxy: ProxyClient,
        launcher: SandboxLauncher,
        harness: HarnessCommand,
        registry: TaskRegistry,
        workspace_root: Path,
        sandbox_root: Path,
        limits: SandboxLimits,
        kill_grace_s: float,
        slots: Slots,
        spawn: Spawn,
        metrics: RunnerMetrics | None = None,
        copy_out_max_bytes: int = 1 << 30,
        copy_out_max_files: int = 100_000,
    ) -> None:
        self.runner_id = runner_id
        self.bus = bus
        self.counters = counters
        self.ownership = ownership
        self.proxy = proxy
        self.launcher = launcher
        self.harness = harness
        self.registry = registry
        self.workspace_root = workspace_root
        self.sandbox_root = sandbox_root
        self.limits = limits
        self.kill_grace_s = kill_grace_s
        self.copy_out_max_bytes = copy_out_max_bytes
        self.copy_out_max_files = copy_out_max_files
        """Caps of what is copied out of an execution's sandbox (launchers with their own filesystem)."""
        self.slots = slots
        self._spawn = spawn
        self.metrics = metrics or RunnerMetrics(CollectorRegistry())
        self.running: dict[str, RunningExecution] = {}
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.pending: set[str] = set()
        """Executions begun here (claimed, their request acknowledged) whose start has not completed."""
        self.started_total = 0
        self.accepting = True
        """False after `close()`: start requests then terminate as CANCELLED without starting."""

    # -- start ---------------------------------------------------------------------------------
    async def start(self, request: ev.ExecutionStartRequested) -> bool:
        """Start one execution; True when it is running (it then holds the caller's slot)."""
        pending = await self.begin(request)
        return pending is not None and await self.complete(pending)

    async def begin(self, request: ev.ExecutionStartRequested) -> PendingStart | None:
        """The part of a start that must be done before its request is acknowledged: the claim and the
        owned record (from then on a restart finds and reports it). None when there is nothing to start:
        another runner holds it, or it was reported here (a redelivery, the runner closing)."""
        eid = request.execution.execution_id
        bind_context(execution=eid)
        if not eid:
            log.error("start_request_without_execution_id", task=request.task_id)
            return None
        began = time.monotonic()
        task, error = self._lookup(request.task_id)
        owned = await self._claim(request, task)
        if owned is None:
            return None
        if not self.accepting:
            await self._cancel_before_start(owned)
            return None
        self.pending.add(eid)
        return PendingStart(request, owned, task, error, began)

    async def complete(self, pending: PendingStart) -> bool:
        """resolve → workspace → credentials → launch; a step that fails reports the execution as never
        started (INFRA_FAILURE, or ENVIRONMENT_UNAVAILABLE when its image cannot be had) with what failed.
        A runner that dies before this ends finds the execution owned without a sandbox at its restart,
        and reports it there (`reconcile`)."""
        eid = pending.owned.execution_id
        bind_context(execution=eid)
        self.metrics.starting += 1
        try:
            return await self._complete(pending)
        finally:
            self.metrics.starting -= 1
            self.pending.discard(eid)

    async def _complete(self, pending: PendingStart) -> bool:
        request, owned = pending.request, pending.owned
        eid = owned.execution_id
        try:
            if not self.accepting:
                await self._cancel_before_start(owned)
                return False
            task, image = await self._resolve(pending.task, pending.error)
            layout = await self._workspace(owned, task, image)
            owned, creds = await self._credentials(owned, request)
            handle = await self._launch(owned, task, layout, creds, image)
        except StartFailed as e:
            await self._fail_before_start(owned, str(e), e.environment)
            return False
        except Exception as e:  # a step's unexpected error ends this start, not the runner
            log.exception("execution_start_crashed")
            await self._reap(eid)
            await self._fail_before_start(owned, f"start failed: {e!r}")
            return False
        owned = owned.with_sandbox(handle.state)
        await self.ownership.record(owned)
        await self.bus.publish(
            ev.ExecutionStarted(
                execution=request.execution, runner_id=self.runner_id, engine_id=owned.engine_id
            ),
            event_id=f"exec.started:{eid}",
        )
        await self._count("started", eid)
        self.started_total += 1
        self.metrics.launch_seconds.observe(time.monotonic() - pending.began)
        log.info("execution_started", task=task.task_id, pid=handle.pid, uid=handle.state.uid)
        running = RunningExecution(owned, handle)
        self._watch(running)
        if not self.accepting:  # the runner was told to stop everything while this one launched
            running.cancel.set()
        return True

    async def _cancel_before_start(self, owned: OwnedExecution) -> None:
        log.info("execution_cancelled_before_start")
        await self._report(
            owned,
            cm.TERMINATION_REASON_CANCELLED,
            0,
            cm.WorkspaceRef(),
            0.0,
            "not started: the runner stopped taking executions (the run is ending)",
        )

    def _lookup(self, task_id: str) -> tuple[Task | None, str]:
        """The task, or None and why not (reported once the execution is claimed)."""
        try:
            return self.registry.get(task_id), ""
        except TaskError as e:
            return None, str(e)

    async def _claim(self, request: ev.ExecutionStartRequested, task: Task | None) -> OwnedExecution | None:
        """Claim the execution in Redis and record it as owned (deadlines from now, the task's timeouts
        unless the request sets them); None when another runner holds it, or when this is a redelivery
        of a start this runner began (reported here)."""
        ref = request.execution
        eid = ref.execution_id
        if not await self.ownership.claim(eid):
            holder = await self.ownership.holder(eid)
            interrupted = next((o for o in await self.ownership.owned() if o.execution_id == eid), None)
            under_way = eid in self.running or eid in self.pending
            if holder == self.runner_id and interrupted is not None and not under_way:
                # A redelivery of a start this runner began and failed part-way: report it, never drop it.
                await self._fail_before_start(
                    interrupted, "the start was interrupted and its request redelivered"
                )
                return None
            log.info("start_request_skipped", holder=holder)
            return None
        harness_s = request.harness_timeout_s or (task.harness_timeout_s if task else 0.0)
        budget_s = request.overall_budget_s or (task.overall_budget_s if task else 0.0)
        now_ms = int(time.time() * 1000)
        owned = OwnedExecution(
            execution_id=eid,
            group_id=ref.group_id,
            index_in_group=ref.index_in_group,
            query_id=ref.query_id,
            task_id=request.task_id,
            engine_id=request.engine_id,
            profile=request.profile or "generic",
            started_at_ms=now_ms,
            harness_deadline_ms=now_ms + int(1000 * min(harness_s, budget_s)),
            budget_deadline_ms=now_ms + int(1000 * budget_s),
            workspace=str(self.workspace_root / eid),
        )
        await self.ownership.record(owned)
        return owned

    async def _resolve(self, task: Task | None, error: str) -> tuple[Task, SandboxImage | None]:
        """The task of the request (`error` says why there is none) and the image it runs in, built
        first where the launcher builds images (None for launchers that run on this host)."""
        if task is None:
            raise StartFailed(error)
        try:
            return task, await self.launcher.environment(task)
        except EnvironmentUnavailableError as e:
            raise StartFailed(str(e), environment=True) from None

    async def _workspace(
        self, owned: OwnedExecution, task: Task, image: SandboxImage | None
    ) -> HarnessLayout:
        """A fresh workspace from the task, and where the harness sees it (in a container: what the
        image does not hold already, copied in)."""
        workspace = Path(owned.workspace)
        if image is None:
            layout = harness_layout(task, workspace, self.launcher.mounts_paths)
        else:
            layout = container_layout(task, workspace)
        try:
            await asyncio.to_thread(
                create_workspace, task, workspace, image is None or not image.holds_workspace
            )
            if layout.agent_logs is not None:
                await asyncio.to_thread(_fresh_dir, layout.agent_logs)
        except OSError as e:
            raise StartFailed(f"workspace: {e}") from None
        return layout

    async def _credentials(
        self, owned: OwnedExecution, request: ev.ExecutionStartRequested
    ) -> tuple[OwnedExecution, Credentials]:
        """The execution's proxy credentials (OpenExecution), recorded as opened."""
        try:
            creds = await self.proxy.open(request.execution, owned.profile, request.engine_id)
        except ProxyUnavailableError as e:
            raise StartFailed(str(e)) from None
        owned = replace(owned, proxy_opened=True)
        await self.ownership.record(owned)
        return owned, creds

    async def _launch(
        self,
        owned: OwnedExecution,
        task: Task,
        layout: HarnessLayout,
        creds: Credentials,
        image: SandboxImage | None,
    ) -> SandboxHandle:
        """The harness in its sandbox, routed to the proxy (and the internet, in a container of a task
        that allows it)."""
        eid = owned.execution_id
        egress = image is not None and bool(task.environment.allow_internet)
        base_url, network = self._route(creds.base_url, egress)
        root = self.sandbox_root / eid
        home = self.launcher.home_inside(root)
        path = image.path if image is not None else BASE_PATH
        launch = Launch(task, layout.prompt, eid, base_url, creds.api_key, home, image is not None, path)
        try:
            tools = self.harness.container_mounts() if image is not None else ()
        except ValueError as e:
            raise StartFailed(f"harness: {e}") from None
        spec = SandboxSpec(
            name=eid,
            argv=self.harness.command(launch),
            cwd=layout.cwd,
            env=self.harness.environment(launch),
            root=root,
            limits=self.harness.limits(self.limits),
            network=network,
            reveal=self.harness.reveal(),
            home_files=self.harness.sandbox_home_files(launch),
            writable=layout.writable,
            binds=layout.binds,
            image=image.reference if image is not None else None,
            copy_in=layout.copy_in,
            tools=tools,
            labels={LABEL_EXECUTION: eid, LABEL_ROLE: "execution"},
            resources=task.environment.resources(),
        )
        try:
            return await self.launcher.launch(spec)
        except EnvironmentUnavailableError as e:
            raise StartFailed(str(e), environment=True) from None
        except (SandboxError, OSError) as e:
            raise StartFailed(f"sandbox: {e}") from None

    def _route(self, base_url: str, egress: bool = False) -> tuple[str, NetworkPolicy]:
        """The URL the harness uses and the network its sandbox gets."""
        if not self.launcher.isolates_network:
            return base_url, NetworkPolicy("host")
        parts = urlsplit(base_url)
        if parts.hostname is None:
            raise ValueError(f"proxy base URL without a host: {base_url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        inside = urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, parts.query, parts.fragment))
        return inside, NetworkPolicy.proxy(parts.hostname, port, egress)

    async def _fail_before_start(self, owned: OwnedExecution, detail: str, environment: bool = False) -> None:
        log.error("execution_never_started", detail=detail, environment_unavailable=environment)
        if environment:
            reason, detail = (
                cm.TERMINATION_REASON_ENVIRONMENT_UNAVAILABLE,
                f"environment unavailable: {detail}",
            )
        else:
            reason, detail = cm.TERMINATION_REASON_INFRA_FAILURE, f"sandbox never started: {detail}"
        await self._report(owned, reason, 0, cm.WorkspaceRef(), 0.0, detail)

    # -- watch ---------------------------------------------------------------------------------
    def _watch(self, running: RunningExecution) -> None:
        eid = running.owned.execution_id
        self.running[eid] = running
        self.tasks[eid] = self._spawn(self._supervise(running), f"execution/{eid}")

    async def _supervise(self, running: RunningExecution) -> None:
        owned, handle = running.owned, running.handle
        bind_context(execution=owned.execution_id)
        left_s = max(0.0, owned.harness_deadline_ms / 1000 - time.time())
        exited = asyncio.ensure_future(handle.wait())
        cancelled = asyncio.ensure_future(running.cancel.wait())
        try:
            done, _ = await asyncio.wait(
                {exited, cancelled}, timeout=left_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            cancelled.cancel()
        if exited in done:
            outcome = exited.result()
            reason = reason_of(outcome)
        else:
            exited.cancel()
            if running.cancel.is_set():
                reason = cm.TERMINATION_REASON_CANCELLED
            elif owned.harness_deadline_ms >= owned.budget_deadline_ms:
                reason = cm.TERMINATION_REASON_OVERALL_TIMEOUT
            else:
                reason = cm.TERMINATION_REASON_HARNESS_TIMEOUT
            log.info("execution_stopping", reason=cm.TerminationReason.Name(reason))
            outcome = await handle.stop(self.kill_grace_s)
        self.metrics.finishing += 1
        try:
            await self._finish(owned, handle, outcome, reason)
        finally:
            self.metrics.finishing -= 1

    async def _finish(
        self,
        owned: OwnedExecution,
        handle: SandboxHandle,
        outcome: SandboxOutcome,
        reason: Reason,
        note: str = "",
    ) -> None:
        survivors = await handle.release()
        detail = outcome.describe()
        if reason == cm.TERMINATION_REASON_HARNESS_TIMEOUT:
            detail = f"harness timeout after {(owned.harness_deadline_ms - owned.started_at_ms) / 1000:.0f} s; {detail}"
        if note:
            detail = f"{note}; {detail}"
        if survivors:
            detail += f"; {len(survivors)} sandbox processes survived the sweep"
            log.error("sandbox_sweep_incomplete", pids=survivors[:10])
        if outcome.started:
            try:
                if not self.launcher.own_filesystem:
                    await self._bound_in_place(owned)
                elif not await self._collect(owned, handle):
                    detail += "; the workspace could not be copied out of the sandbox"
            except CopyOutLimit as e:
                # The harness left more than the host takes: FAILED where it ended by itself or at its
                # own timeout (a stop on purpose or the overall budget keeps its reason); the cap leads.
                if reason in HARNESS_REASONS:
                    reason = cm.TERMINATION_REASON_FAILED
                detail = f"{e}; {detail}"
        workspace = cm.WorkspaceRef()
        if outcome.started and Path(owned.workspace).is_dir():
            await asyncio.to_thread(preserve, Path(owned.workspace))
            await asyncio.to_thread(preserve, agent_logs_of(Path(owned.workspace)))
            digest = await asyncio.to_thread(content_hash, Path(owned.workspace))
            workspace = cm.WorkspaceRef(path=owned.workspace, content_hash=digest)
        exit_code = outcome.exit_code if outcome.exit_code is not None else -(outcome.signal or 0)
        duration_s = max(0.0, time.time() - owned.started_at_ms / 1000)
        await self._report(owned, reason, exit_code, workspace, duration_s, detail)
        if self.running.pop(owned.execution_id, None) is not None:
            self.tasks.pop(owned.execution_id, None)
            await self.slots.release()

    async def _bound_in_place(self, owned: OwnedExecution) -> None:
        """Host launchers write the workspace in place: the same caps bound what the host keeps of it (and
        of /logs/agent); over one, `CopyOutLimit` and neither is kept. (During the run only RLIMIT_FSIZE
        bounds each file: this host's storage has no quota.)"""
        workspace = Path(owned.workspace)
        logs = agent_logs_of(workspace)
        budget = CopyBudget(self.copy_out_max_bytes, self.copy_out_max_files)
        try:
            await asyncio.to_thread(_measure, [workspace, logs], budget)
        except CopyOutLimit as e:
            log.warning("workspace_over_limit", error=str(e))
            await asyncio.to_thread(shutil.rmtree, workspace, True)
            await asyncio.to_thread(shutil.rmtree, logs, True)
            raise

    async def _collect(self, owned: OwnedExecution, handle: SandboxHandle) -> bool:
        """Copy a container's workspace (its working directory) and /logs/agent out to the host, where
        they are preserved and hashed; the container stays for the verifier. False (and no workspace
        left on the host) when they cannot be had; `CopyOutLimit` (and neither left on the host) when
        together they pass a cap of `copy_out_max_bytes` / `copy_out_max_files`."""
        workspace = Path(owned.workspace)
        task, _ = self._lookup(owned.task_id)
        await asyncio.to_thread(shutil.rmtree, workspace, True)
        if task is None:
            return False
        inside = task.environment.workdir or DEFAULT_WORKDIR
        logs = agent_logs_of(workspace)
        budget = CopyBudget(self.copy_out_max_bytes, self.copy_out_max_files)
        try:
            await asyncio.to_thread(_fresh_dir, logs)
            if await handle.copy_out(inside, workspace, budget):
                await handle.copy_out(AGENT_LOGS_DIR, logs, budget)
                return True
        except CopyOutLimit as e:
            log.warning("workspace_copy_out_limit", error=str(e))
            await asyncio.to_thread(shutil.rmtree, workspace, True)
            await asyncio.to_thread(shutil.rmtree, logs, True)
            raise
        except (SandboxError, OSError) as e:
            log.error("workspace_copy_failed", error=str(e))
        await asyncio.to_thread(shutil.rmtree, workspace, True)
        return False

    async def _report(
        self,
        owned: OwnedExecution,
        reason: Reason,
        exit_code: int,
        workspace: cm.WorkspaceRef,
        duration_s: float,
        detail: str,
    ) -> None:
        eid = owned.execution_id
        if owned.proxy_opened:
            await self.proxy.close_execution(eid)
        ref = cm.ExecutionRef(
            execution_id=eid,
            group_id=owned.group_id,
            index_in_group=owned.index_in_group,
            query_id=owned.query_id,
        )
        await self._count("started", eid)
        await self._count("finished", eid)
        await self.bus.publish(
            ev.ExecutionTerminated(
                execution=ref,
                reason=reason,
                exit_code=exit_code,
                workspace=workspace,
                duration_s=duration_s,
                detail=detail[:1000],
                task_id=owned.task_id,
                budget_deadline_ms=owned.budget_deadline_ms,
            ),
            event_id=f"exec.terminated:{eid}",
        )
        await self.ownership.forget(
            eid, cm.TerminationReason.Name(reason).removeprefix("TERMINATION_REASON_")
        )
        self.metrics.terminated.labels(reason_label(cm.TerminationReason.Name(reason))).inc()
        if duration_s > 0:  # 0 for an execution that never started
            self.metrics.execution_seconds.observe(duration_s)
        log.info(
            "execution_terminated",
            execution=eid,
            reason=cm.TerminationReason.Name(reason),
            exit_code=exit_code,
            detail=detail[:200],
        )

    async def _count(self, counter: str, eid: str) -> None:
        try:
            await self.counters.add(counter, 1, token=eid)  # type: ignore[arg-type]
        except CounterInvariantError as e:
            log.error("counter_invariant_broken", counter=counter, execution=eid, error=str(e))

    # -- restart and control -------------------------------------------------------------------
    async def reconcile(self) -> dict[str, int]:
        """Adopt owned executions whose sandbox still runs; terminate the others with a reason."""
        counts = {"adopted": 0, "terminated": 0}
        for owned in await self.ownership.owned():
            bind_context(execution=owned.execution_id)
            if owned.sandbox is None:
                await self._reap(owned.execution_id)
                await self._report(
                    owned,
                    cm.TERMINATION_REASON_INFRA_FAILURE,
                    0,
                    cm.WorkspaceRef(),
                    0.0,
                    "sandbox never started: the runner stopped before launching it",
                )
                counts["terminated"] += 1
                continue
            handle = self.launcher.attach(owned.sandbox)
            if handle.running():
                self.slots.take()
                self._watch(RunningExecution(owned, handle))
                log.info("execution_adopted", pid=handle.pid)
                counts["adopted"] += 1
                continue
            outcome = handle.recorded()
            if outcome is None:
                outcome = SandboxOutcome(None, None, started=True, error="no exit status recorded")
                reason: Reason = cm.TERMINATION_REASON_INFRA_FAILURE
            else:
                reason = reason_of(outcome)
            await self._finish(
                owned, handle, outcome, reason, note="runner lost the process while it was down"
            )
            counts["terminated"] += 1
        return counts

    async def _reap(self, execution_id: str) -> None:
        """Remove a sandbox the launcher may keep for an execution whose start was interrupted (the
        container exists, its state was never recorded)."""
        try:
            removed = await self.launcher.reap({LABEL_EXECUTION: execution_id})
        except SandboxError as e:
            log.error("sandbox_reap_failed", error=str(e))
            return
        if removed:
            log.info("sandbox_reaped", containers=removed)

    def close(self) -> None:
        """Take no more executions: later start requests terminate as CANCELLED without starting."""
        self.accepting = False

    def cancel(self, execution_id: str | None) -> int:
        """Stop one running execution (or all with None); each terminates as CANCELLED."""
        targets = (
            list(self.running.values())
            if execution_id is None
            else ([self.running[execution_id]] if execution_id in self.running else [])
        )
        for running in targets:
            running.cancel.set()
        return len(targets)
