"""Sandbox launchers: run one command (a harness, a verifier) isolated, stop it, sweep it.

    launcher = make_launcher("auto", uid_base=120000, num_slots=32)
    handle = await launcher.launch(SandboxSpec(name=eid, argv=[...], cwd=ws, env={...},
                                               root=sandbox_dir, limits=SandboxLimits(),
                                               network=NetworkPolicy.proxy("127.0.0.1", 8123)))
    outcome = await handle.wait()          # or: await handle.stop(grace_s=5) on a timeout
    await handle.release()                 # sweep leftovers, give the uid back

What each launcher enforces (`launcher.enforced()` says it at run time):

- `isolated` (needs root): everything `process` does, plus its own uid per sandbox slot (so
  RLIMIT_NPROC bounds the sandbox and a sweep kills every process it left, even ones that called
  setsid), no supplementary groups, and a network namespace with only loopback: the proxy is
  reachable at 127.0.0.1:<its port> through a relay (`proxy`), or nothing is (`none`).
- `process`: its own session; the command in its own process group (stopped with SIGTERM, grace,
  SIGKILL to that group), a scrubbed environment (exactly `spec.env` plus HOME and TMPDIR),
  rlimits (CPU, address space, file size, open files; RLIMIT_NPROC is ignored for root), stdin
  from /dev/null, stdout/stderr to files. No network isolation; processes that leave the group
  (setsid) are not reached.

With a fork server (`launcher.fork_server`, forkserver.py), a `python -m MODULE` command the server
has preloaded starts from a fork of it instead of a new interpreter: the same supervisor code (init.py),
the same isolation steps in the same order, only the final exec replaced by running the module in place.

`spec.binds` gives host directories at absolute paths inside the sandbox (a Harbor task's `/app`,
`/tests`, `/logs/verifier`): only a launcher with `mounts_paths` honours them (`isolated`: a mount
namespace and a chroot into a bind-mounted view of the host root, see init.py); callers rewrite the
paths instead where it cannot (gyre/sandbox/task_paths.py).

Adding a launcher (e.g. a Kubernetes pod): subclass `SandboxLauncher`, implement `launch`,
`attach` and `enforced`, add it to `LAUNCHERS`; tests/unit/sandbox/test_sandbox_contract.py runs
the contract over every launcher the machine supports.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from gyre.sandbox import procs
from gyre.sandbox.forkclient import ForkServer, ForkServerError
from gyre.sandbox.limits import SandboxLimits
from gyre.sandbox.outcome import SandboxOutcome, read_outcome
from gyre.tasks import check_relative

INIT_SCRIPT = Path(__file__).with_name("init.py")
NetworkMode = Literal["proxy", "none", "host"]


class SandboxError(RuntimeError):
    """The sandbox could not be created (the command never started)."""


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    mode: NetworkMode = "host"
    target_host: str = ""
    target_port: int = 0

    @classmethod
    def proxy(cls, host: str, port: int) -> NetworkPolicy:
        return cls("proxy", host, port)


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    name: str
    """Unique name (execution id, or evaluation attempt id)."""
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    root: Path
    """Directory for this sandbox: `control/` (root only), `home/` (the sandbox's HOME and TMPDIR)."""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    reveal: tuple[Path, ...] = ()
    """Paths the command needs besides its cwd, HOME and the Python installation (e.g. the repo)."""
    home_files: dict[str, str] = field(default_factory=dict)
    """Files written into HOME (relative paths) before the command starts."""
    writable: tuple[Path, ...] = ()
    """Trees handed to the sandbox uid before the command starts (the workspace)."""
    binds: tuple[tuple[Path, str], ...] = ()
    """(host directory or file, absolute path inside): bind mounts of the command's view of the
    filesystem; `cwd` may lie inside one. Only launchers with `mounts_paths` accept them."""

    def host_path(self, inside: Path) -> Path:
        """Where a path the command sees lies on the host (itself when no bind covers it)."""
        for source, target in self.binds:
            if inside == Path(target) or Path(target) in inside.parents:
                return source / inside.relative_to(target)
        return inside

    @property
    def control_dir(self) -> Path:
        return self.root / "control"

    @property
    def home(self) -> Path:
        return self.root / "home"


@dataclass(frozen=True, slots=True)
class SandboxState:
    """What a runner persists to re-attach to a sandbox after it restarts."""

    pid: int
    started: int
    """Start time of `pid` (ms since the epoch, from psutil): guards against pid reuse."""
    uid: int | None
    root: str


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """chown -R without following symlinks."""
    os.lchown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


class Supervisor(Protocol):
    """The sandbox supervisor as its starter sees it: an asyncio child, or a fork server's ForkedProcess."""

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


class SandboxHandle:
    """A running (or finished) sandbox: wait for it, stop it, sweep and release it."""

    def __init__(
        self,
        launcher: SandboxLauncher,
        state: SandboxState,
        process: Supervisor | None,
    ) -> None:
        self.launcher = launcher
        self.state = state
        self._process = process
        self._released = False

    @property
    def pid(self) -> int:
        return self.state.pid

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
        outcome = read_outcome(self.control_dir)
        if outcome is None:
            return SandboxOutcome(
                None, None, started=True, error="sandbox supervisor vanished without a status"
            )
        return outcome

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
        """SIGTERM, up to `grace_s` to exit, then SIGKILL; returns the outcome."""
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
        """Sweep and give the slot back (idempotent); the caller keeps the workspace."""
        if self._released:
            return []
        survivors = await self.sweep()
        self._released = True
        self.launcher.release(self.state)
        return survivors


class SandboxLauncher(ABC):
    """Base of the launcher registry (`LAUNCHERS`)."""

    name: ClassVar[str]
    isolates_network: ClassVar[bool] = False
    """True when sandboxes reach only the relayed proxy (the harness gets a loopback base URL)."""
    mounts_paths: ClassVar[bool] = False
    """True when `SandboxSpec.binds` are honoured (else a spec with binds is refused)."""
    fork_server: ForkServer | None = None
    """Where `python -m MODULE` commands it preloaded are forked from (None: every start is an exec)."""

    @abstractmethod
    def enforced(self) -> dict[str, str]:
        """What this launcher enforces on this machine (logged at service start)."""

    @abstractmethod
    async def launch(self, spec: SandboxSpec) -> SandboxHandle:
        """Start `spec.argv`; `SandboxError` when the sandbox could not be created."""

    @abstractmethod
    def attach(self, state: SandboxState) -> SandboxHandle:
        """Re-attach to a sandbox started by an earlier incarnation of this process."""

    @abstractmethod
    def release(self, state: SandboxState) -> None:
        """Return the sandbox's slot (uid) to the pool."""

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
        env = {"HOME": str(home), "TMPDIR": str(home / "tmp"), **spec.env}
        net: dict[str, Any] = {"mode": network.mode}
        if network.mode == "proxy":
            net |= {
                "target_host": network.target_host,
                "target_port": network.target_port,
                "listen_port": network.target_port,
                "socket": "proxy.sock",
            }
        init_spec = {
            "argv": spec.argv,
            "cwd": str(spec.cwd),
            "env": env,
            "control_dir": str(control),
            "limits": spec.limits.rlimits(),
            "uid": uid,
            "gid": uid,
            "network": net,
            "reveal": [
                str(p)
                for p in (
                    spec.host_path(spec.cwd),
                    home,
                    Path(sys.prefix),
                    Path(sys.base_prefix),
                    *spec.reveal,
                    *(source for source, _ in spec.binds),
                )
            ],
            "binds": [[str(source), target] for source, target in spec.binds],
            "root_dir": str(control / "root"),
        }
        spec_path = control / "spec.json"
        spec_path.write_text(json.dumps(init_spec))
        os.chmod(spec_path, 0o600)
        server = self.fork_server
        if server is not None and server.accepts(spec.argv, env):
            try:
                forked = await server.spawn(spec_path, control / "supervisor.log")
            except ForkServerError:
                pass  # logged by the server's client; this start is a plain one
            else:
                started = forked.started
                state = SandboxState(forked.pid, started if started is not None else -1, uid, str(spec.root))
                return SandboxHandle(self, state, forked)
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
        return SandboxHandle(self, state, process)


class ProcessLauncher(SandboxLauncher):
    """Own session/process group, scrubbed env, rlimits; no uid switch, no network isolation."""

    name = "process"

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
        }

    async def launch(self, spec: SandboxSpec) -> SandboxHandle:
        network = NetworkPolicy("host")
        return await self._start(spec, None, network)

    def attach(self, state: SandboxState) -> SandboxHandle:
        return SandboxHandle(self, state, None)

    def release(self, state: SandboxState) -> None:
        return None


class IsolatedLauncher(SandboxLauncher):
    """Per-slot uid, rlimits, network namespace with a loopback relay to the proxy (root only)."""

    name = "isolated"
    isolates_network = True
    mounts_paths = True

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
        return SandboxHandle(self, state, None)

    def release(self, state: SandboxState) -> None:
        if state.uid is not None and state.uid in self._used:
            self._used.discard(state.uid)
            self._free.append(state.uid)


LAUNCHERS: dict[str, type[SandboxLauncher]] = {
    ProcessLauncher.name: ProcessLauncher,
    IsolatedLauncher.name: IsolatedLauncher,
}


def make_launcher(isolation: str, uid_base: int, num_slots: int) -> SandboxLauncher:
    """`auto` = `isolated` when running as root, else `process`."""
    if isolation == "auto":
        isolation = IsolatedLauncher.name if os.geteuid() == 0 else ProcessLauncher.name
    if isolation == IsolatedLauncher.name:
        return IsolatedLauncher(uid_base, num_slots)
    if isolation == ProcessLauncher.name:
        return ProcessLauncher()
    raise ValueError(f"unknown sandbox isolation {isolation!r}; choose auto, {', '.join(LAUNCHERS)}")
