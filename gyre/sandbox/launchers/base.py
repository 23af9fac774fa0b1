"""The extension point of sandboxes: what runs one command (a harness, a verifier) isolated, stops it
and sweeps it. The runner and the evaluator drive every launcher through this interface only:

    launcher = make_launcher("isolated", LauncherSpec(num_slots=32, uids=range(120000, 120032)))
    handle = await launcher.launch(SandboxSpec(name=eid, argv=[...], cwd=ws, env={...}, root=box_dir,
                                               network=NetworkPolicy.proxy("127.0.0.1", 8123)))
    outcome = await handle.wait()          # or: await handle.stop(grace_s=5) on a timeout
    await handle.release()                 # sweep what the command left, give the slot back
    ...                                    # after a restart of the owner:
    handle = launcher.attach(state)        # state = handle.state, persisted by the owner

To add a launcher (a Kubernetes pod, a remote sandbox service): write a module in this package with a
subclass of `SandboxLauncher` (set `name` and the capability flags, implement `create`, `enforced`,
`launch`, `attach`, `release`) and of `SandboxHandle`, and add a loader of the class to `LAUNCHERS` in
`gyre/sandbox/launchers/__init__.py`. The config field `<service>.sandbox.isolation` then accepts its
name, and tests/unit/sandbox/test_sandbox_contract.py runs the contract over it (every registered name:
a launcher this machine cannot run fails there with the reason, or is skipped outside CI).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from gyre.config.runner import SandboxSection
from gyre.sandbox.limits import SandboxLimits
from gyre.sandbox.outcome import SandboxOutcome

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
    """Directory for this sandbox on the host: `control/` (root only), `home/` (the sandbox's HOME and
    TMPDIR where the command runs on the host)."""
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
    """What an owner persists to re-attach to a sandbox after it restarts."""

    pid: int
    started: float
    """Start time of `pid` (seconds since the epoch, `gyre.procs.start_time`): guards against pid reuse."""
    uid: int | None
    root: str


@dataclass(frozen=True, slots=True)
class LauncherSpec:
    """Everything a launcher is built from."""

    section: SandboxSection = field(default_factory=SandboxSection)
    """The service's `sandbox:` section."""
    num_slots: int = 1
    """Sandboxes the service runs at once."""
    uids: range | None = None
    """The uids its sandboxes may run as (launchers with `uses_uids`; None otherwise)."""


class SandboxHandle(ABC):
    """A running (or finished) sandbox: wait for it, stop it, sweep and release it."""

    def __init__(self, launcher: SandboxLauncher, state: SandboxState) -> None:
        self.launcher = launcher
        self.state = state

    @property
    def pid(self) -> int:
        return self.state.pid

    @abstractmethod
    def running(self) -> bool:
        """The command still runs."""

    @abstractmethod
    async def wait(self, poll_s: float = 0.2) -> SandboxOutcome:
        """Until the command has ended; how it ended."""

    @abstractmethod
    async def stop(self, grace_s: float) -> SandboxOutcome:
        """SIGTERM, up to `grace_s` to exit, then SIGKILL; returns the outcome."""

    @abstractmethod
    async def release(self) -> list[int]:
        """Sweep what the command left and give the slot back (idempotent); returns survivors."""

    @abstractmethod
    def recorded(self) -> SandboxOutcome | None:
        """How the command ended as recorded by the sandbox (None when nothing was recorded)."""

    @abstractmethod
    def stdout(self) -> str:
        """The command's standard output (what was kept of it)."""


class SandboxLauncher(ABC):
    """Base of the launcher registry (`LAUNCHERS` in gyre/sandbox/launchers/__init__.py)."""

    name: ClassVar[str]
    isolates_network: ClassVar[bool] = False
    """True when sandboxes reach only the relayed proxy (the harness gets a loopback base URL)."""
    mounts_paths: ClassVar[bool] = False
    """True when `SandboxSpec.binds` are honoured (else a spec with binds is refused)."""
    uses_uids: ClassVar[bool] = False
    """True when sandboxes run under uids of the service's own range (`LauncherSpec.uids`)."""

    @classmethod
    @abstractmethod
    def create(cls, spec: LauncherSpec) -> SandboxLauncher:
        """The launcher of one service instance; `SandboxError` when this machine cannot run it."""

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

    async def close(self) -> None:
        """Free what the launcher holds (connections); sandboxes are left as they are."""
        return None
