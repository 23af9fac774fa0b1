"""Scoring one terminated execution: the task's verifier on its preserved workspace, in the same
kind of sandbox as the harness (no network at all), with retries inside the overall budget. With a
launcher whose sandboxes have their own filesystem (`container`), a Harbor verifier runs in the
execution's own container after the harness (services/evaluator/in_container.py); other verifiers
(`score_line`: Gyre's built-in tasks, task.yaml) run on this host in `host_launcher`'s sandbox.

Outcome classes (docs/design.md, "Outcomes"; the paper's "Partial scoring"):

- **valid**: the verifier gave a score in [0, 1] (a `{"score": x}` last stdout line, or Harbor's
  reward.txt / reward.json: services/evaluator/protocols.py). This holds after any termination,
  timeouts included: partial work scores what it is worth.
- **pending**: an attempt failed (a crash, no score or reward file, a score out of range, a verifier
  timeout). The attempt is retried with exponential backoff on a fresh copy of the same preserved
  state, while the execution's overall budget lasts and attempts remain.
- **excluded**: the budget or the attempts ran out without a valid score (not a zero), the
  task has no verifier, or its environment was unavailable (its image did not build, no engine).
- **placeholder**: nothing is evaluable (the sandbox never started, no or a vanished
  workspace): reward 0, so the group still counts N members.

The reward is the verifier's score and nothing else: never time, length or termination reason.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path

from gyre.log import get_logger
from gyre.sandbox import NetworkPolicy, SandboxError, SandboxLauncher, SandboxLimits, SandboxSpec
from gyre.sandbox.workspace import content_hash, copy_workspace
from gyre.tasks import Task, TaskError, TaskRegistry
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.evaluator.in_container import ContainerVerifier
from services.evaluator.protocols import PROTOCOLS, Attempt
from services.evaluator.store import Evaluation

log = get_logger("gyre.evaluator")


class VerifierRunner:
    """Evaluates preserved workspaces; one instance per evaluator process."""

    def __init__(
        self,
        *,
        registry: TaskRegistry,
        launcher: SandboxLauncher,
        work_root: Path,
        limits: SandboxLimits,
        max_attempts: int,
        backoff_s: float,
        kill_grace_s: float,
        host_launcher: SandboxLauncher | None = None,
    ) -> None:
        self.registry = registry
        self.launcher = host_launcher or launcher
        """Where verifiers that run on this host run (all of them, unless `launcher` has its own filesystem)."""
        self.in_container = (
            ContainerVerifier(launcher, work_root, kill_grace_s) if launcher.own_filesystem else None
        )
        """Harbor verifiers in the execution's own container (launchers with their own filesystem)."""
        self.work_root = work_root
        self.limits = limits
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.kill_grace_s = kill_grace_s

    async def evaluate(self, term: ev.ExecutionTerminated) -> Evaluation:
        eid = term.execution.execution_id
        path = term.workspace.path

        def outcome(status: str, reward: float, digest: str, attempts: int, detail: str) -> Evaluation:
            return Evaluation(eid, status, reward, path, digest, attempts, detail[:1000])  # type: ignore[arg-type]

        if term.reason == cm.TERMINATION_REASON_ENVIRONMENT_UNAVAILABLE:
            return outcome("excluded", 0.0, "", 0, term.detail or "the task's environment was unavailable")
        if not path or not Path(path).is_dir():
            why = term.detail or "no workspace"
            return outcome("placeholder", 0.0, "", 0, f"nothing evaluable: {why}")
        try:
            task = self.registry.get(term.task_id)
        except TaskError as e:
            return outcome("excluded", 0.0, "", 0, f"cannot evaluate: {e}")
        digest = await asyncio.to_thread(content_hash, Path(path))
        if term.workspace.content_hash and digest != term.workspace.content_hash:
            log.warning("workspace_changed_after_termination", execution=eid)
        if not task.verifier.argv:
            return outcome("excluded", 0.0, digest, 0, "the task has no verifier")
        deadline_s = (
            term.budget_deadline_ms / 1000 if term.budget_deadline_ms else time.time() + task.overall_budget_s
        )
        failures: list[str] = []
        for attempt in range(1, self.max_attempts + 1):
            left_s = deadline_s - time.time()
            if left_s <= 0:
                break
            timeout_s = min(task.verifier.timeout_s, left_s)
            if self.in_container is not None and task.verifier.protocol == "harbor":
                result = await self.in_container.attempt(task, eid, Path(path), digest, attempt, timeout_s)
            else:
                result = await self._attempt(task, eid, Path(path), attempt, timeout_s)
            if result.score is not None:
                return outcome("valid", result.score, digest, attempt, result.detail)
            failures.append(f"attempt {attempt}: {result.detail}")
            log.warning("verifier_attempt_failed", execution=eid, attempt=attempt, detail=result.detail)
            delay_s = self.backoff_s * 2 ** (attempt - 1)
            if attempt == self.max_attempts or time.time() + delay_s >= deadline_s:
                break
            await asyncio.sleep(delay_s)
        why = "; ".join(failures[-3:]) or "the overall budget was spent before evaluation"
        return outcome("excluded", 0.0, digest, len(failures), f"no valid score within the budget: {why}")

    async def release(self, eid: str) -> None:
        """The execution is accounted: remove what the launcher kept of it (its container)."""
        if self.in_container is not None:
            await self.in_container.release(eid)

    async def _attempt(
        self, task: Task, eid: str, workspace: Path, attempt: int, timeout_s: float
    ) -> Attempt:
        root = (
            self.work_root / eid / f"{attempt}-{uuid.uuid4().hex[:8]}"
        )  # a duplicate evaluation may run alongside
        copy = root / "workspace"
        protocol = PROTOCOLS[task.verifier.protocol]
        try:
            await asyncio.to_thread(copy_workspace, workspace, copy)
            plan = await asyncio.to_thread(
                protocol.plan, task, root, copy, workspace, self.launcher.mounts_paths
            )
        except (OSError, ValueError) as e:
            await asyncio.to_thread(shutil.rmtree, copy, True)
            return Attempt(None, f"verifier setup: {e}")
        spec = SandboxSpec(
            name=f"{eid}/{attempt}",
            argv=plan.argv,
            cwd=plan.cwd,
            env=plan.env,
            root=root / "sandbox",
            limits=self.limits,
            network=NetworkPolicy("none"),
            reveal=plan.reveal,
            writable=plan.writable,
            binds=plan.binds,
        )
        try:
            handle = await self.launcher.launch(spec)
        except (SandboxError, OSError) as e:
            return Attempt(None, f"verifier sandbox: {e}")
        try:
            try:
                result = await asyncio.wait_for(asyncio.shield(handle.wait()), timeout=timeout_s)
            except TimeoutError:
                await handle.stop(self.kill_grace_s)
                return Attempt(None, f"verifier timed out after {timeout_s:.1f} s")
        finally:
            await handle.release()
            await asyncio.to_thread(shutil.rmtree, copy, True)
        if not result.started:
            return Attempt(None, f"verifier sandbox never started: {result.error}")
        return await asyncio.to_thread(protocol.result, root, result, handle.stdout())
