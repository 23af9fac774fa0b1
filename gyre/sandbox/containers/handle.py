"""One container of the `container` launcher as its owner drives it: the command running in it (the
harness), further commands after it (the verifier), copies in and out, the proxy relay, removal.

Every command runs through the engine's exec API under a small `/bin/sh` wrapper (`WRAPPER`) that sends
its output to files under /.gyre/control/ and writes its exit status there when it ends. The engine's
state of a detached exec cannot be trusted (podman 4.3 reports it running forever), so the owner watches
the wrapper's host pid (with its start time, against pid reuse) and reads the status file from the
container (gyre/sandbox/containers/processes.py): both survive a restart of the owner, which re-attaches
from `SandboxState` alone. A stop signals every process of the container but its init and the wrapper
(SIGTERM, grace, SIGKILL), so the wrapper records how the command ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from gyre import procs
from gyre.sandbox.containers import archive, engine, processes
from gyre.sandbox.containers.netns import listen_inside
from gyre.sandbox.launchers.base import (
    CopyBudget,
    ExecResult,
    SandboxError,
    SandboxHandle,
    SandboxLauncher,
    SandboxState,
)
from gyre.sandbox.outcome import SandboxOutcome

CONTROL = "/.gyre/control"
WRAPPER = f'"$@" </dev/null >{CONTROL}/"$0".stdout 2>{CONTROL}/"$0".stderr; echo $? >{CONTROL}/"$0".status'
"""`sh -c WRAPPER NAME ARGV...`: run ARGV, its output and exit status in /.gyre/control/NAME.*"""
EMPTY = (
    'for d in "$0" "$@"; do [ ! -d "$d" ] || (cd -- "$d" && rm -rf -- ./* ./.[!.]* ./..?*) || exit 1; done'
)
"""`sh -c EMPTY DIR...`: remove what each DIR holds, keeping DIR itself (its owner and mode)."""
RELAY_SCRIPT = Path(__file__).with_name("relay.py")


_KILL_ROUND_S = 0.05


class Command:
    """One wrapped command in a container: its name and the wrapper's host pid."""

    def __init__(self, name: str, pid: int, started: float) -> None:
        self.name = name
        self.pid = pid
        self.started = started

    def running(self) -> bool:
        return self.pid > 0 and procs.alive(self.pid, self.started)


class ContainerEngineLauncher(SandboxLauncher):
    """A launcher whose sandboxes are containers of a Docker Engine API: what a `ContainerHandle` needs of
    the launcher that made it (`ContainerLauncher`, gyre/sandbox/launchers/container.py, which imports the
    handle), besides `release`."""

    @property
    @abstractmethod
    def client(self) -> docker.DockerClient:
        """The engine's client."""


class ContainerHandle(SandboxHandle):
    """A container whose main command is `state.command` (the harness)."""

    launcher: ContainerEngineLauncher

    def __init__(
        self, launcher: ContainerEngineLauncher, state: SandboxState, container: Container | None
    ) -> None:
        super().__init__(launcher, state)
        self._container = container
        self.command = Command(state.command, state.pid, state.started)
        self.uid, self.gid = 0, 0
        self.user: str | None = None
        self._released = False

    # -- the container -------------------------------------------------------------------------
    @property
    def control_dir(self) -> Path:
        return Path(self.state.root) / "control"

    def container(self) -> Container | None:
        """The container (looked up once), None when it is gone."""
        if self._container is None and self.state.container:
            try:
                self._container = self.launcher.client.containers.get(self.state.container)
            except docker.errors.NotFound:
                return None
            except (docker.errors.DockerException, OSError) as e:
                raise engine.ContainerEngineError(
                    f"container {self.state.container[:12]}: {engine.why(e)}"
                ) from None
        return self._container

    def init_pid(self, refresh: bool = True) -> int | None:
        """The host pid of the container's init while the container runs (`refresh`: inspect it again)."""
        container = self.container()
        if container is None:
            return None
        try:
            if refresh:
                container.reload()
        except docker.errors.NotFound:
            return None
        pid = int(container.attrs.get("State", {}).get("Pid") or 0)
        return pid if pid > 0 and container.status == "running" else None

    def resolve_user(self) -> None:
        """The container's user (`Config.User`: the configured one, else the image's) and its numeric
        uid and gid, which own what is copied in."""
        container = self.container()
        if container is None:
            return
        user = (container.attrs.get("Config") or {}).get("User") or ""
        self.user = user or None
        name, _, group = user.partition(":")
        if not name or name == "root":
            self.uid, self.gid = 0, int(group) if group.isdigit() else 0
            return
        if name.isdigit():
            self.uid = int(name)
            self.gid = int(group) if group.isdigit() else self.uid
            return
        init = self.init_pid()
        passwd = processes.read_inside(init, "/etc/passwd", 1 << 20) if init else None
        for line in (passwd or b"").decode(errors="replace").splitlines():
            fields = line.split(":")
            if len(fields) > 3 and fields[0] == name and fields[2].isdigit() and fields[3].isdigit():
                self.uid, self.gid = int(fields[2]), int(fields[3])
                return
        raise SandboxError(f"user {name!r} of the container is not in its /etc/passwd")

    # -- the main command ----------------------------------------------------------------------
    def running(self) -> bool:
        return self.command.running()

    async def wait(self, poll_s: float = 0.2) -> SandboxOutcome:
        while self.command.running():
            await asyncio.sleep(poll_s)
        outcome = await asyncio.to_thread(self.recorded)
        if outcome is None:
            return SandboxOutcome(None, None, started=True, error="the container vanished without a status")
        self._keep(outcome)
        return outcome

    def _keep(self, outcome: SandboxOutcome) -> None:
        """The harness's outcome also on the host (`control/status.json`, the keys init.py writes), where it
        stays after the container is removed."""
        if self.control_dir.is_dir():
            status = {
                "exit_code": outcome.exit_code,
                "signal": outcome.signal,
                "exec_error": outcome.error or None,
                "sandbox_cpu_s": outcome.sandbox_cpu_s,
                "memory_killed": outcome.memory_killed,
            }
            (self.control_dir / "status.json").write_text(json.dumps(status))

    def recorded(self) -> SandboxOutcome | None:
        return self._outcome(self.command.name)

    def _outcome(self, name: str) -> SandboxOutcome | None:
        """How command `name` ended (a wrapper that ended without a status was killed); None when the
        container is gone."""
        init = self.init_pid()
        if init is None:
            return None
        raw = processes.read_inside(init, f"{CONTROL}/{name}.status", 64)
        err = processes.read_inside(init, f"{CONTROL}/{name}.stderr", 4096) or b""
        lines = [ln.strip() for ln in err.decode(errors="replace").splitlines() if ln.strip()]
        common: dict[str, Any] = {
            "started": True,
            "sandbox_cpu_s": round(processes.cpu_s(init), 3),
            "stderr_tail": lines[-1][:300] if lines else "",
            "memory_killed": processes.oom_kills(init) > 0,
        }
        try:
            code = int(raw.decode().strip()) if raw is not None else None
        except ValueError:
            code = None
        if code is None:
            return SandboxOutcome(None, int(signal.SIGKILL), **common)
        if code > 128 and code - 128 < 65:
            return SandboxOutcome(None, code - 128, **common)
        if code == 127 and "not found" in common["stderr_tail"]:
            return SandboxOutcome(None, None, **{**common, "started": False}, error=common["stderr_tail"])
        return SandboxOutcome(code, None, **common)

    async def stop(self, grace_s: float) -> SandboxOutcome:
        await self._stop(self.command, grace_s)
        outcome = await asyncio.to_thread(self._outcome, self.command.name)
        if outcome is None:
            return SandboxOutcome(None, int(signal.SIGKILL), started=True, error="container gone")
        self._keep(outcome)
        return outcome

    async def _stop(self, command: Command, grace_s: float) -> None:
        """SIGTERM to every process but init and the wrapper, `grace_s` to end, then SIGKILL until the
        command is gone (the wrapper itself is killed only if it outlives that)."""
        init = await asyncio.to_thread(self.init_pid)
        if init is None:
            return
        keep = {init, command.pid}
        processes.signal_all(init, signal.SIGTERM, keep)
        deadline = time.monotonic() + grace_s
        while command.running() and time.monotonic() < deadline:
            await asyncio.sleep(_KILL_ROUND_S)
        deadline = time.monotonic() + 10.0
        while command.running() and time.monotonic() < deadline:
            processes.signal_all(init, signal.SIGKILL, keep)
            await asyncio.sleep(_KILL_ROUND_S)
        if command.running():
            processes.signal_all(init, signal.SIGKILL, {init})

    async def release(self) -> list[int]:
        """Kill what the harness left in the container and its relay; the container stays (its
        filesystem is what the verifier scores)."""
        if self._released:
            return []
        self._released = True
        survivors = await self._sweep()
        self.stop_relay()
        self.launcher.release(self.state)
        return survivors

    async def _sweep(self, timeout_s: float = 10.0) -> list[int]:
        init = await asyncio.to_thread(self.init_pid)
        if init is None:
            return []
        deadline = time.monotonic() + timeout_s
        while True:
            left = [p for p in processes.container_pids(init) if p != init]
            if not left or time.monotonic() > deadline:
                return left
            processes.signal_all(init, signal.SIGKILL, {init})
            await asyncio.sleep(_KILL_ROUND_S)

    def stdout(self) -> str:
        return self._read(f"{self.command.name}.stdout")

    def _read(self, name: str, max_bytes: int = 1 << 20) -> str:
        init = self.init_pid()
        raw = processes.read_inside(init, f"{CONTROL}/{name}", max_bytes) if init else None
        return raw.decode(errors="replace") if raw else ""

    # -- the relay -----------------------------------------------------------------------------
    async def start_relay(self, init: int, port: int, target_host: str, target_port: int) -> None:
        """The container's only exit: 127.0.0.1:`port` inside, relayed to the proxy (relay.py)."""
        try:
            listener = await asyncio.to_thread(listen_inside, init, port)
        except OSError as e:
            raise SandboxError(f"the proxy relay cannot listen in the container: {e}") from None
        self.control_dir.mkdir(parents=True, exist_ok=True)
        try:
            with (self.control_dir / "relay.log").open("ab") as log:
                argv = [str(init), str(listener.fileno()), target_host, str(target_port)]
                process = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(RELAY_SCRIPT), *argv],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(listener.fileno(),),
                    start_new_session=True,
                )
        finally:
            listener.close()
        started = procs.start_time(process.pid)
        (self.control_dir / "relay.json").write_text(json.dumps({"pid": process.pid, "started": started}))
        # not waited for: it runs in a session of its own and may outlive this process (a restart)

    def stop_relay(self) -> None:
        try:
            relay = json.loads((self.control_dir / "relay.json").read_text())
        except (OSError, ValueError):
            return
        if relay.get("started") is not None and procs.alive(relay["pid"], relay["started"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(relay["pid"], signal.SIGKILL)

    # -- environment operations ----------------------------------------------------------------
    async def run(
        self, name: str, argv: list[str], cwd: str, env: dict[str, str], user: str | None
    ) -> Command:
        """Start `argv` under the wrapper (detached); the command it became."""

        def start() -> Command:
            container = self.container()
            if container is None:
                raise SandboxError("the container is gone")
            api = self.launcher.client.api
            try:
                created = api.exec_create(
                    container.id,
                    ["/bin/sh", "-c", WRAPPER, name, *argv],
                    environment=env,
                    workdir=cwd,
                    user=user or "",
                )
                api.exec_start(created["Id"], detach=True)
                pid = int(api.exec_inspect(created["Id"]).get("Pid") or 0)
            except (docker.errors.DockerException, OSError) as e:
                raise SandboxError(f"exec in container {container.id[:12]}: {engine.why(e)}") from None
            started = procs.start_time(pid) if pid else None
            return Command(name, pid if started is not None else 0, started if started is not None else -1)

        return await asyncio.to_thread(start)

    async def exec(
        self, name: str, argv: list[str], cwd: str, env: dict[str, str], timeout_s: float, grace_s: float
    ) -> ExecResult:
        command = await self.run(name, argv, cwd, env, self.user)
        deadline = time.monotonic() + timeout_s
        timed_out = False
        while command.running():
            if time.monotonic() > deadline:
                timed_out = True
                await self._stop(command, grace_s)
                break
            await asyncio.sleep(0.05)
        outcome = await asyncio.to_thread(self._outcome, name)
        if outcome is None:
            outcome = SandboxOutcome(None, None, started=False, error="the container is gone")
        return ExecResult(outcome, await asyncio.to_thread(self._read, f"{name}.stdout"), timed_out)

    async def copy_in(self, copies: Sequence[tuple[Path, str]], replace: bool = False) -> None:
        init = await asyncio.to_thread(self.init_pid)
        there = [inside for _, inside in copies if init and processes.exists_inside(init, inside)]
        # Emptied as the container's user (capabilities dropped: root cannot override permissions), and
        # only what exists: an exec is a runc start.
        if replace and there:
            result = await self.exec(
                f"empty-{uuid.uuid4().hex[:12]}",
                ["/bin/sh", "-c", EMPTY, *there],
                "/",
                {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                60.0,
                1.0,
            )
            if result.outcome.exit_code != 0:
                raise SandboxError(f"emptying {there} in the container: {result.outcome.describe()}")
        entries: list[archive.Entry] = [
            archive.TreeEntry(source, inside.strip("/")) for source, inside in copies
        ]
        data = await asyncio.to_thread(archive.pack, entries, self.uid, self.gid)
        await asyncio.to_thread(self.put, "/", data)

    def put(self, path: str, data: bytes) -> None:
        container = self.container()
        if container is None:
            raise SandboxError("the container is gone")
        try:
            container.put_archive(path, data)
        except (docker.errors.DockerException, OSError) as e:
            raise SandboxError(f"copying into container {container.id[:12]}: {engine.why(e)}") from None

    async def copy_out(self, inside: str, target: Path, budget: CopyBudget | None = None) -> bool:
        init = await asyncio.to_thread(self.init_pid)
        if init is None:
            return False
        return await asyncio.to_thread(processes.copy_out, init, inside, target, budget=budget)

    async def remove(self) -> None:
        self.stop_relay()
        container = await asyncio.to_thread(self.container)
        if container is not None:
            await asyncio.to_thread(engine.remove, container)
        self._container = None
        self.state = SandboxState(0, -1, None, self.state.root, "", self.state.command)
