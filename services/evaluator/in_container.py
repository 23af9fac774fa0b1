"""Harbor verifiers in the execution's own container (launchers with their own filesystem: `container`),
after the harness, in Harbor's order.

    verifier = ContainerVerifier(launcher, work_root, kill_grace_s)
    attempt = await verifier.attempt(task, eid, preserved_workspace, digest, n, timeout_s)
    await verifier.release(eid)            # once the evaluation is stored: the container goes

An attempt finds the execution's container by its labels (the runner kept it when the harness ended),
checks that its working directory holds exactly the preserved state the evaluation is bound to (the
workspace's content hash) and restores it from the preserved copy when it does not (an earlier attempt
changed it), copies the task's `tests/` to /tests and an empty /logs/verifier in (only now: the harness
never saw them), runs `bash /tests/test.sh` in the working directory as the container's user under the
verifier's timeout, and copies /logs/verifier out, where services/evaluator/rewards.py reads
reward.txt or reward.json. The network is what the harness had minus the proxy (the relay is gone).

An execution whose container is gone (removed, or the engine restarted) is scored in a fresh container
of the task's image, with the preserved workspace and agent logs copied in and no network.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

from gyre.log import get_logger
from gyre.sandbox import NetworkPolicy, SandboxError, SandboxHandle, SandboxLauncher, SandboxSpec
from gyre.sandbox.launchers.base import LABEL_EXECUTION, LABEL_ROLE
from gyre.sandbox.task_paths import agent_logs_of
from gyre.sandbox.workspace import content_hash
from gyre.tasks import Task
from gyre.tasks.dockerfile import DEFAULT_WORKDIR
from gyre.tasks.harbor import AGENT_LOGS_DIR, TESTS_DIR, VERIFIER_LOGS_DIR
from services.evaluator.protocols import PROTOCOLS, Attempt, resolve_env

log = get_logger("gyre.evaluator")


class ContainerVerifier:
    def __init__(self, launcher: SandboxLauncher, work_root: Path, kill_grace_s: float) -> None:
        assert launcher.own_filesystem, "verifiers run in the execution's sandbox only where it has one"
        self.launcher = launcher
        self.work_root = work_root
        self.kill_grace_s = kill_grace_s

    async def attempt(
        self, task: Task, eid: str, workspace: Path, digest: str, attempt: int, timeout_s: float
    ) -> Attempt:
        root = self.work_root / eid / f"{attempt}-{uuid.uuid4().hex[:8]}"
        workdir = task.environment.workdir or DEFAULT_WORKDIR
        try:
            handle = await self.launcher.find({LABEL_EXECUTION: eid, LABEL_ROLE: "execution"})
            fresh = handle is None
            if handle is None:
                handle = await self._fresh(task, eid, workspace, root)
            else:
                await self._restore(handle, workdir, workspace, digest, root)
        except (SandboxError, OSError) as e:
            return Attempt(None, f"verifier sandbox: {e}")
        try:
            return await self._run(handle, task, root, workdir, attempt, timeout_s, fresh)
        except (SandboxError, OSError) as e:
            return Attempt(None, f"verifier in the container: {e}")
        finally:
            if fresh:
                await handle.remove()
            await asyncio.to_thread(shutil.rmtree, root / "check", True)

    async def _run(
        self,
        handle: SandboxHandle,
        task: Task,
        root: Path,
        workdir: str,
        attempt: int,
        timeout_s: float,
        fresh: bool,
    ) -> Attempt:
        assert task.verifier.tests_dir is not None, "a Harbor verifier has a tests/ directory"
        tests, empty = root / "tests", root / "empty"
        await asyncio.to_thread(shutil.copytree, task.verifier.tests_dir, tests, symlinks=True)
        empty.mkdir(parents=True)
        await handle.copy_in([(tests, TESTS_DIR), (empty, VERIFIER_LOGS_DIR)], replace=True)
        name = f"verifier-{attempt}-{root.name.rsplit('-', 1)[-1]}"
        result = await handle.exec(
            name,
            list(task.verifier.argv),
            workdir,
            resolve_env(task.verifier.env),
            timeout_s,
            self.kill_grace_s,
        )
        if result.timed_out:
            return Attempt(None, f"verifier timed out after {timeout_s:.1f} s")
        if not result.outcome.started:
            return Attempt(None, f"verifier never started: {result.outcome.error}")
        await handle.copy_out(VERIFIER_LOGS_DIR, root / "logs" / "verifier")
        scored = await asyncio.to_thread(PROTOCOLS["harbor"].result, root, result.outcome, result.stdout)
        where = "a fresh container (the execution's was gone)" if fresh else "the execution's container"
        return Attempt(scored.score, f"{scored.detail}; in {where}")

    async def _restore(
        self, handle: SandboxHandle, workdir: str, workspace: Path, digest: str, root: Path
    ) -> None:
        """The container's working directory as preserved: restored from the preserved copy when its
        content hash differs from the one the evaluation is bound to."""
        check = root / "check"
        found = await handle.copy_out(workdir, check)
        if found and await asyncio.to_thread(content_hash, check) == digest:
            return
        log.warning("container_workspace_restored", workdir=workdir, found=found)
        await handle.copy_in([(workspace, workdir)], replace=True)

    async def _fresh(self, task: Task, eid: str, workspace: Path, root: Path) -> SandboxHandle:
        image = await self.launcher.environment(task)
        assert image is not None
        workdir = task.environment.workdir or DEFAULT_WORKDIR
        copies = [(workspace, workdir)]
        if agent_logs_of(workspace).is_dir():
            copies.append((agent_logs_of(workspace), AGENT_LOGS_DIR))
        spec = SandboxSpec(
            name=f"{eid}-verify-{root.name}",
            argv=[],
            cwd=Path(workdir),
            env={},
            root=root / "sandbox",
            network=NetworkPolicy("none"),
            image=image.reference,
            copy_in=tuple(copies),
            labels={LABEL_EXECUTION: eid, LABEL_ROLE: "verifier"},
            resources=task.environment.resources(),
        )
        return await self.launcher.provision(spec)

    async def release(self, eid: str) -> None:
        """Remove every container of the execution (its own and any fresh verifier's)."""
        try:
            await self.launcher.reap({LABEL_EXECUTION: eid})
        except SandboxError as e:
            log.error("sandbox_reap_failed", execution=eid, error=str(e))
