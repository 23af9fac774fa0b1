"""Harbor verifiers of executions that ran in containers (launchers with their own filesystem:
`container`): by default in a fresh container of the task's built image, where the harness never ran.

    verifier = ContainerVerifier(launcher, work_root, kill_grace_s)
    attempt = await verifier.attempt(task, eid, preserved_workspace, digest, n, timeout_s)
    await verifier.release(eid)            # once the evaluation is stored: every container of it goes

The harness is the policy's code, root in its container when the image has no USER: it can rewrite
anything its image holds, the grader a RUN step made included. So an attempt starts a fresh container of
the task's image (no network), puts the preserved workspace in its working directory (the whole directory
as the harness left it, or, where the task declares `[verifier] agent_paths`, only those paths over the
image's own files), copies the task's `tests/` to /tests and an empty /logs/verifier in, runs `bash
/tests/test.sh` in the working directory as the image's user under the verifier's timeout, and copies
/logs/verifier out, where services/evaluator/rewards.py reads reward.txt or reward.json.

Harbor's own order (the verifier in the execution's container, after the harness) is the opt-in
`[verifier] same_container = true` for tests that need state outside the workspace, which the run must
allow (`tasks.allow_same_container_verifier`) and its summary names. Then the attempt finds the execution's
container by its labels (the runner kept it), checks that its working directory holds exactly the preserved
state the evaluation is bound to and restores it from the preserved copy when it does not; an execution
whose container is gone is scored in a fresh one.
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
        handle: SandboxHandle | None = None
        try:
            if task.verifier.same_container:
                handle = await self.launcher.find({LABEL_EXECUTION: eid, LABEL_ROLE: "execution"})
            fresh = handle is None
            if handle is None:
                handle = await self._fresh(task, eid, workspace, root)
                await self._place(handle, task, workdir, workspace, root)
            else:
                await self._restore(handle, workdir, workspace, digest, root)
        except (SandboxError, OSError) as e:
            if fresh and handle is not None:
                await handle.remove()
            return Attempt(None, f"verifier sandbox: {e}")
        try:
            return await self._run(handle, task, root, workdir, attempt, timeout_s, fresh)
        except (SandboxError, OSError) as e:
            return Attempt(None, f"verifier in the container: {e}")
        finally:
            if fresh:
                await handle.remove()
            await asyncio.to_thread(shutil.rmtree, root / "check", True)
            await asyncio.to_thread(shutil.rmtree, root / "carried", True)

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
        if not fresh:
            where = "the execution's container (same_container)"
        elif task.verifier.same_container:
            where = "a fresh container (the execution's was gone)"
        else:
            where = "a fresh container of the task's image"
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

    async def _place(
        self, handle: SandboxHandle, task: Task, workdir: str, workspace: Path, root: Path
    ) -> None:
        """The preserved workspace into the fresh container's working directory: all of it, replacing
        what the image has there; or only the task's `agent_paths`, each replacing the image's own (and
        removed where the agent removed it)."""
        paths = task.verifier.agent_paths
        if paths is None:
            await handle.copy_in([(workspace, workdir)], replace=True)
            return
        carried = root / "carried"
        await asyncio.to_thread(carry, workspace, paths, carried)
        result = await handle.exec(
            "remove-agent-paths",
            ["/bin/rm", "-rf", "--", *(f"{workdir.rstrip('/')}/{p}" for p in paths)],
            "/",
            {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            60.0,
            self.kill_grace_s,
        )
        if result.outcome.exit_code != 0:
            raise SandboxError(f"removing the image's {list(paths)}: {result.outcome.describe()}")
        await handle.copy_in([(carried, workdir)])

    async def _fresh(self, task: Task, eid: str, workspace: Path, root: Path) -> SandboxHandle:
        image = await self.launcher.environment(task)
        assert image is not None
        workdir = task.environment.workdir or DEFAULT_WORKDIR
        copies = []
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
            change_user=True,
        )
        return await self.launcher.provision(spec)

    async def release(self, eid: str) -> None:
        """Remove every container of the execution (its own and any fresh verifier's)."""
        try:
            await self.launcher.reap({LABEL_EXECUTION: eid})
        except SandboxError as e:
            log.error("sandbox_reap_failed", execution=eid, error=str(e))


def carry(workspace: Path, paths: tuple[str, ...], target: Path) -> None:
    """Copy each of `paths` (relative, checked at load) from `workspace` to the same place under `target`,
    symlinks as symlinks; a path the agent removed is left out, and so is one reached through a symlink
    (a link in the workspace must not make the copy read the host's files)."""
    target.mkdir(parents=True)
    for rel in paths:
        parts = Path(rel).parts
        source = workspace
        for part in parts:
            source = source / part
            if source.is_symlink() and part != parts[-1]:
                break
        else:
            if not source.exists() and not source.is_symlink():
                continue
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir() and not source.is_symlink():
                shutil.copytree(source, dest, symlinks=True)
            else:
                shutil.copy2(source, dest, follow_symlinks=False)
