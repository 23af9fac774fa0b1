"""The `isolated` launcher (needs root): everything `process` does, plus its own uid per sandbox slot
(so RLIMIT_NPROC bounds the sandbox and a sweep kills every process it left, even ones that called
setsid), no supplementary groups, a network namespace with only loopback (the proxy reachable at
127.0.0.1:<its port> through a relay, or nothing), and a mount namespace in which a task's absolute
paths are bind mounts (gyre/sandbox/init.py)."""

from __future__ import annotations

import asyncio
import os

from gyre import procs
from gyre.sandbox.launchers.base import (
    LauncherSpec,
    NetworkPolicy,
    SandboxError,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
)
from gyre.sandbox.launchers.supervised import SupervisedHandle, SupervisedLauncher


class IsolatedLauncher(SupervisedLauncher):
    """Per-slot uid, rlimits, network namespace with a loopback relay to the proxy (root only)."""

    name = "isolated"
    isolates_network = True
    mounts_paths = True
    uses_uids = True

    def __init__(self, uid_base: int, num_slots: int) -> None:
        if os.geteuid() != 0:
            raise SandboxError("the isolated launcher needs root (setuid, network namespaces); use `process`")
        if uid_base < 1000 or num_slots < 1:
            raise ValueError(
                f"uid_base must be at least 1000 and num_slots positive; got {uid_base}, {num_slots}"
            )
        self.uid_base = uid_base
        self.num_slots = num_slots
        self._free = list(range(uid_base, uid_base + num_slots))
        self._used: set[int] = set()

    @classmethod
    def create(cls, spec: LauncherSpec) -> IsolatedLauncher:
        if spec.uids is None:
            raise ValueError(
                "the isolated launcher runs its sandboxes under uids of its own; give it a range"
            )
        return cls(spec.uids.start, len(spec.uids))

    def enforced(self) -> dict[str, str]:
        return {
            "launcher": self.name,
            "uid": f"one uid per slot ({self.uid_base}..{self.uid_base + self.num_slots - 1}), no supplementary "
            "groups; the workspace is owned by it while the harness runs, by root afterwards",
            "process_group": "own session and process group; stop = SIGTERM, grace, SIGKILL to the group and "
            "to every process of the slot uid (also ones that left the group)",
            "environment": "scrubbed: only the variables the runner passes; HOME and TMPDIR private",
            "rlimits": "CPU, address space, processes (per uid), file size, open files, no core dumps",
            "network": "own network namespace with only loopback; the proxy is relayed to 127.0.0.1:<port>",
            "paths": "a task's absolute environment paths (/app, /tests, /logs/...) are bind mounts in the "
            "command's own mount namespace",
            "image": "none: the command runs on this host's tools (a Dockerfile's RUN steps are not applied)",
        }

    async def launch(self, spec: SandboxSpec, wait_s: float = 60.0) -> SandboxHandle:
        """Waits up to `wait_s` for a free uid (callers normally bound their concurrency to the slots)."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while not self._free:
            if asyncio.get_running_loop().time() > deadline:
                raise SandboxError(f"all {self.num_slots} sandbox uids stayed in use for {wait_s:.0f} s")
            await asyncio.sleep(0.05)
        uid = self._free.pop(0)
        self._used.add(uid)
        stale = await procs.kill_uid(uid)
        if stale:
            self._used.discard(uid)
            raise SandboxError(f"sandbox uid {uid} still has processes {stale[:5]}")
        network = spec.network if spec.network.mode != "host" else NetworkPolicy("none")
        try:
            return await self._start(spec, uid, network)
        except BaseException:
            self.release(SandboxState(0, 0, uid, ""))
            raise

    def attach(self, state: SandboxState) -> SandboxHandle:
        if state.uid is not None and state.uid in self._free:
            self._free.remove(state.uid)
            self._used.add(state.uid)
        return SupervisedHandle(self, state, None)

    def release(self, state: SandboxState) -> None:
        if state.uid is not None and state.uid in self._used:
            self._used.discard(state.uid)
            self._free.append(state.uid)
