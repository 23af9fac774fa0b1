"""Launchers whose command runs on this host under the sandbox supervisor (gyre/sandbox/init.py):
`process` and `isolated`. The supervisor writes the command's outcome to `control/status.json`; the
handle waits for it, signals the command's process group (and, with a uid of its own, every process of
that uid) and sweeps what is left.

With a fork server (`launcher.fork_server`, forkserver.py), a `python -m MODULE` command the server
has preloaded starts from a fork of it instead of a new interpreter: the same supervisor code (init.py),
the same isolation steps in the same order, only the final exec replaced by running the module in place.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Protocol

from gyre import procs
from gyre.sandbox.forkclient import ForkServer, ForkServerError
from gyre.sandbox.launchers.base import (
    NetworkPolicy,
    SandboxError,
    SandboxHandle,
    SandboxLauncher,
    SandboxSpec,
    SandboxState,
)
from gyre.sandbox.outcome import SandboxOutcome, read_outcome
from gyre.sandbox.workspace import chown_tree
from gyre.tasks import check_relative

INIT_SCRIPT = Path(__file__).resolve().parents[1] / "init.py"  # gyre/sandbox/init.py


class Supervisor(Protocol):
    """The sandbox supervisor as its starter sees it: an asyncio child, or a fork server's ForkedProcess."""

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


class SupervisedHandle(SandboxHandle):
    """A sandbox run by init.py on this host."""

    def __init__(self, launcher: SandboxLauncher, state: SandboxState, process: Supervisor | None) -> None:
        super().__init__(launcher, state)
        self._process = process
        self._released = False

    @property
    def control_dir(self) -> Path:
        return Path(self.state.root) / "control"

    def running(self) -> bool:
        if self._process is not None:
            return self._process.returncode is None
        return procs.alive(self.state.pid, self.state.started)

    async def wait(self, poll_s: float = 0.2) -> SandboxOutcome:
        """Until the supervisor exits (a child is awaited; an adopted one is polled)."""
        if self._process is not None:
            await self._process.wait()
        else:
            while procs.alive(self.state.pid, self.state.started):
                await asyncio.sleep(poll_s)
        outcome = self.recorded()
        if outcome is None:
            return SandboxOutcome(
                None, None, started=True, error="sandbox supervisor vanished without a status"
            )
        return outcome

    def recorded(self) -> SandboxOutcome | None:
        return read_outcome(self.control_dir)

    def stdout(self) -> str:
        path = self.control_dir / "stdout.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def command_group(self) -> int | None:
        """Process group of the command (its pid), once the supervisor has started it."""
        try:
            return int(json.loads((self.control_dir / "command.json").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None

    async def signal(self, sig: int) -> None:
        """Signal the command's process group and, under its own uid, every process of that uid."""
        group = self.command_group()
        if group is not None:
            procs.signal_group(group, sig)
        elif sig == signal.SIGKILL:
            procs.signal_group(self.state.pid, sig)  # not started yet: take the supervisor down too
        if self.state.uid is not None:
            await procs.signal_uid(self.state.uid, sig)

    async def stop(self, grace_s: float) -> SandboxOutcome:
        await self.signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(asyncio.shield(self.wait()), timeout=grace_s)
        except TimeoutError:
            pass
        await self.signal(signal.SIGKILL)
        await self.sweep()
        try:
            return await asyncio.wait_for(self.wait(), timeout=10.0)
        except TimeoutError:
            procs.signal_group(self.state.pid, signal.SIGKILL)
            return await self.wait()

    async def sweep(self) -> list[int]:
        """Kill everything the command left behind; returns survivors (empty on success)."""
        survivors: list[int] = []
        if self.state.uid is not None:
            survivors = await procs.kill_uid(self.state.uid)
        group = self.command_group()
        if group is not None:
            procs.signal_group(group, signal.SIGKILL)
        if not self.running():
            procs.signal_group(self.state.pid, signal.SIGKILL)
        return survivors

    async def release(self) -> list[int]:
        if self._released:
            return []
        survivors = await self.sweep()
        self._released = True
        self.launcher.release(self.state)
        return survivors


class SupervisedLauncher(SandboxLauncher):
    """Starts init.py with a spec of the sandbox (directly, or forked from the fork server)."""

    fork_server: ForkServer | None = None
    """Where `python -m MODULE` commands it preloaded are forked from (None: every start is an exec)."""

    def attach(self, state: SandboxState) -> SandboxHandle:
        return SupervisedHandle(self, state, None)

    async def _start(self, spec: SandboxSpec, uid: int | None, network: NetworkPolicy) -> SandboxHandle:
        if spec.binds and not self.mounts_paths:
            raise SandboxError(f"the {self.name} launcher cannot bind-mount paths; rewrite them instead")
        for source, inside in spec.binds:
            if not Path(inside).is_absolute() or Path(inside) == Path("/") or not source.exists():
                raise SandboxError(
                    f"bind {source} → {inside}: needs an existing source and an absolute target below /"
                )
        control, home = spec.control_dir, spec.home
        if spec.root.exists():
            await asyncio.to_thread(shutil.rmtree, spec.root)
        control.mkdir(parents=True)
        (home / "tmp").mkdir(parents=True)
        for rel, content in spec.home_files.items():
            target = home / check_relative(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        os.chmod(spec.root, 0o711)
        os.chmod(control, 0o700)
        if uid is not None:
            chown_tree(home, uid, uid)
            os.chmod(home, 0o700)
            for path in spec.writable:
                await asyncio.to_thread(chown_tree, path, uid, uid)
        spec_path = control / "spec.json"
        spec_path.write_text(json.dumps(_init_spec(spec, uid, network)))
        os.chmod(spec_path, 0o600)
        env = {"HOME": str(home), "TMPDIR": str(home / "tmp"), **spec.env}
        server = self.fork_server
        if server is not None and server.accepts(spec.argv, env):
            try:
                forked = await server.spawn(spec_path, control / "supervisor.log")
            except ForkServerError:
                pass  # logged by the server's client; this start is a plain one
            else:
                started = forked.started
                state = SandboxState(forked.pid, started if started is not None else -1, uid, str(spec.root))
                return SupervisedHandle(self, state, forked)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                str(INIT_SCRIPT),
                str(spec_path),
                start_new_session=True,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=(control / "supervisor.log").open("ab"),
            )
        except OSError as e:
            raise SandboxError(f"cannot start the sandbox supervisor: {e}") from e
        started = procs.start_time(process.pid)
        state = SandboxState(process.pid, started if started is not None else -1, uid, str(spec.root))
        return SupervisedHandle(self, state, process)


def _init_spec(spec: SandboxSpec, uid: int | None, network: NetworkPolicy) -> dict[str, Any]:
    """The spec init.py reads (its keys are documented there)."""
    home = spec.home
    net: dict[str, Any] = {"mode": network.mode}
    if network.mode == "proxy":
        net |= {
            "target_host": network.target_host,
            "target_port": network.target_port,
            "listen_port": network.target_port,
            "socket": "proxy.sock",
        }
    revealed = (
        spec.host_path(spec.cwd),
        home,
        Path(sys.prefix),
        Path(sys.base_prefix),
        *spec.reveal,
        *(source for source, _ in spec.binds),
    )
    return {
        "argv": spec.argv,
        "cwd": str(spec.cwd),
        "env": {"HOME": str(home), "TMPDIR": str(home / "tmp"), **spec.env},
        "control_dir": str(spec.control_dir),
        "limits": spec.limits.rlimits(),
        "uid": uid,
        "gid": uid,
        "network": net,
        "reveal": [str(p) for p in revealed],
        "binds": [[str(source), target] for source, target in spec.binds],
        "root_dir": str(spec.control_dir / "root"),
    }
