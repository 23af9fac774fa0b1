"""The `process` launcher: the command in its own session and process group on this host, with a
scrubbed environment and rlimits; no uid of its own, no network or filesystem isolation. Runs without
root (a developer's laptop, CI without privileges)."""

from __future__ import annotations

from gyre.sandbox.launchers.base import LauncherSpec, NetworkPolicy, SandboxHandle, SandboxSpec, SandboxState
from gyre.sandbox.launchers.supervised import SupervisedLauncher


class ProcessLauncher(SupervisedLauncher):
    """Own session/process group, scrubbed env, rlimits; no uid switch, no network isolation."""

    name = "process"

    @classmethod
    def create(cls, spec: LauncherSpec) -> ProcessLauncher:
        return cls()

    def enforced(self) -> dict[str, str]:
        return {
            "launcher": self.name,
            "process_group": "own session and process group; stop = SIGTERM, grace, SIGKILL to the group",
            "environment": "scrubbed: only the variables the runner passes",
            "rlimits": "CPU, address space, file size, open files, no core dumps",
            "processes": "RLIMIT_NPROC set but not enforced for root; processes that leave the group survive a stop",
            "network": "not isolated (the harness can reach any address)",
            "paths": "a task's absolute environment paths (/app, /tests, /logs/...) are rewritten to host "
            "directories in prompts and verifier scripts (no mount namespace)",
            "image": "none: the command runs on this host's tools (a Dockerfile's RUN steps are not applied)",
        }

    async def launch(self, spec: SandboxSpec) -> SandboxHandle:
        return await self._start(spec, None, NetworkPolicy("host"))

    def release(self, state: SandboxState) -> None:
        return None
