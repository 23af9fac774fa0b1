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
`launch`, `attach`, `release`) and of `SandboxHandle`, add a loader of the class to `LAUNCHERS` in
`gyre/sandbox/launchers/__init__.py` and its name to `LAUNCHER_NAMES` in gyre/config/runner.py. The config
field `<service>.sandbox.isolation` then accepts its name, and tests/unit/sandbox/test_sandbox_contract.py
runs the contract over it (every registered name: a launcher this machine cannot run fails there with the
reason, or is skipped outside CI).

A launcher whose sandboxes have a filesystem of their own (`own_filesystem`: the `container` launcher;
a Kubernetes pod launcher would be one too) keeps the sandbox after its command ends and implements the
environment operations: `exec` (the verifier, after the harness, in the same sandbox, as Harbor does),
`copy_in` / `copy_out` (the workspace, the task's tests, the reward files), `stdout` (its logs),
`stop`, `remove`, and `attach` / `find` / `reap` by labels (a restarted owner re-attaches or reaps).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, Literal

from gyre.config.runner import SandboxSection
from gyre.sandbox.limits import SandboxLimits
from gyre.sandbox.outcome import SandboxOutcome
from gyre.tasks import Task

NetworkMode = Literal["proxy", "none", "host"]

LABEL_RUN = "gyre.run"
LABEL_RUN_DIR = "gyre.run-dir"
"""The run's directory: two runs of the same id in different directories never touch each other's sandboxes."""
LABEL_EXECUTION = "gyre.execution"
LABEL_ROLE = "gyre.role"
"""`execution` (a harness's sandbox, kept for its verifier) or `verifier` (a fresh sandbox for an
evaluation whose execution's sandbox is gone)."""
LABEL_SERVICE = "gyre.service"
LABEL_SANDBOX = "gyre.sandbox"
EXTRA_LABELS_ENV = "GYRE_SANDBOX_LABELS"
"""`key=value,key=value`: labels added to every kept sandbox (a CI job, a test session), so that whoever
started a set of runs can find all of their containers."""


class SandboxError(RuntimeError):
    """The sandbox could not be created (the command never started)."""


class CopyOutLimit(SandboxError):
    """A copy out of a sandbox stopped at one of its caps (`CopyBudget`): the sandbox's command wrote more
    than the host takes. The message is one line naming the cap and the counts; nothing was written
    past the cap and the partial copy is removed."""


@dataclass(slots=True)
class CopyBudget:
    """What copies out of one sandbox may write on the host, shared by the copies it is passed to (an
    execution's workspace and its agent logs together): `max_bytes` of regular files' content and
    `max_files` entries (regular files, symlinks and directories each count one)."""

    max_bytes: int
    max_files: int
    bytes: int = 0
    """Copied so far."""
    files: int = 0
    """Entries created so far."""

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_files < 1:
            raise ValueError(
                f"copy-out caps must be at least 1; got {self.max_bytes} bytes, {self.max_files} files"
            )

    def add_file(self) -> None:
        """One more entry, or `CopyOutLimit` (nothing counted) when that would pass `max_files`."""
        if self.files + 1 > self.max_files:
            raise CopyOutLimit(
                f"copy-out over its file cap: more than {self.max_files} files "
                f"(runner.sandbox.copy_out_max_files); stopped after {self.files} files, {self.bytes} bytes"
            )
        self.files += 1

    def add_bytes(self, n: int) -> None:
        """`n` more bytes, or `CopyOutLimit` (nothing counted) when that would pass `max_bytes`."""
        self.need_bytes(n)
        self.bytes += n

    def need_bytes(self, n: int) -> None:
        """`CopyOutLimit` when `n` more bytes would pass `max_bytes` (counts nothing)."""
        if self.bytes + n > self.max_bytes:
            raise CopyOutLimit(
                f"copy-out over its byte cap: more than {self.max_bytes} bytes "
                f"(runner.sandbox.copy_out_max_bytes); stopped after {self.bytes} bytes, {self.files} files"
            )


class EnvironmentUnavailableError(SandboxError):
    """The task's environment cannot be had: its image failed to build or exists nowhere, or no container
    engine answers. The message is one line naming the task and the step, or the endpoint."""


@dataclass(frozen=True, slots=True)
class SandboxImage:
    """The image a task's sandboxes start from (launchers with their own filesystem)."""

    reference: str
    holds_workspace: bool
    """True when the image holds the task's workspace already (its Dockerfile's COPY steps put it there),
    so only the task's extra files are copied in."""
    path: str
    """The image's PATH (a harness puts its own bin directories in front)."""


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    mode: NetworkMode = "host"
    target_host: str = ""
    target_port: int = 0
    egress: bool = False
    """Besides the proxy, the internet (a task's `allow_internet`), where the launcher isolates networks."""

    @classmethod
    def proxy(cls, host: str, port: int, egress: bool = False) -> NetworkPolicy:
        return cls("proxy", host, port, egress)


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


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
    image: str | None = None
    """The image of a launcher with its own filesystem (None: the launcher's default image)."""
    copy_in: tuple[tuple[Path, str], ...] = ()
    """(host directory, absolute path inside): contents copied into a sandbox with its own filesystem
    before the command starts (a workspace its image does not hold)."""
    tools: tuple[tuple[Path, str], ...] = ()
    """(host file or directory, absolute path inside): what the command needs from the host in a sandbox
    with its own filesystem (a harness's binary, the demo harness's packages), mounted read-only."""
    labels: Mapping[str, str] = field(default_factory=_empty)
    """Labels that find the sandbox again (its execution), where the launcher keeps sandboxes."""
    resources: Mapping[str, float] = field(default_factory=_empty)  # type: ignore[arg-type]
    """The task's own resources (`cpus`, `memory_mb`, `storage_mb`, `gpus`), applied where the launcher
    can (a launcher that cannot give what is asked refuses the spec)."""
    change_user: bool = False
    """The sandbox's commands may change their uid and gid (CAP_SETUID and CAP_SETGID kept, nothing else):
    a verifier's, so its grader can run the agent's code as another user than the one that writes the
    reward. Never a harness's."""

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
    container: str = ""
    """The container's id (launchers with their own filesystem)."""
    command: str = ""
    """The name of the command inside the container (its control files)."""


@dataclass(frozen=True, slots=True)
class LauncherSpec:
    """Everything a launcher is built from."""

    section: SandboxSection = field(default_factory=SandboxSection)
    """The service's `sandbox:` section."""
    num_slots: int = 1
    """Sandboxes the service runs at once."""
    uids: range | None = None
    """The uids its sandboxes may run as (launchers with `uses_uids`; None otherwise)."""
    labels: Mapping[str, str] = field(default_factory=_empty)
    """Labels every sandbox of this service carries (run id, service instance), where sandboxes have labels."""
    work_dir: Path | None = None
    """Where the launcher writes what it keeps (image build logs); None = nowhere."""


@dataclass(frozen=True, slots=True)
class ExecResult:
    """How a command run by `SandboxHandle.exec` ended."""

    outcome: SandboxOutcome
    stdout: str
    timed_out: bool


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

    # -- environment operations (launchers with `own_filesystem`) --------------------------------
    async def exec(
        self, name: str, argv: list[str], cwd: str, env: dict[str, str], timeout_s: float, grace_s: float
    ) -> ExecResult:
        """Run another command in this sandbox (the verifier) as its user, stopped (SIGTERM, `grace_s`,
        SIGKILL) past `timeout_s`. `name` names its control files (unique per sandbox)."""
        raise NotImplementedError(f"the {self.launcher.name} launcher has no sandbox filesystem")

    async def copy_in(self, copies: Sequence[tuple[Path, str]], replace: bool = False) -> None:
        """Copy each host directory to its path inside (what those held emptied first with `replace`)."""
        raise NotImplementedError(f"the {self.launcher.name} launcher has no sandbox filesystem")

    async def copy_out(self, inside: str, target: Path, budget: CopyBudget | None = None) -> bool:
        """Copy the contents of `inside` into host directory `target`; False when `inside` is missing.
        With a `budget`, `CopyOutLimit` (and no `target` left) when the copy would pass one of its caps;
        without one, unbounded."""
        raise NotImplementedError(f"the {self.launcher.name} launcher has no sandbox filesystem")

    async def remove(self) -> None:
        """Remove the sandbox and everything in it (idempotent)."""
        raise NotImplementedError(f"the {self.launcher.name} launcher has no sandbox filesystem")


class SandboxLauncher(ABC):
    """Base of the launcher registry (`LAUNCHERS` in gyre/sandbox/launchers/__init__.py)."""

    name: ClassVar[str]
    isolates_network: ClassVar[bool] = False
    """True when sandboxes reach only the relayed proxy (the harness gets a loopback base URL)."""
    mounts_paths: ClassVar[bool] = False
    """True when `SandboxSpec.binds` are honoured (else a spec with binds is refused)."""
    uses_uids: ClassVar[bool] = False
    """True when sandboxes run under uids of the service's own range (`LauncherSpec.uids`)."""
    own_filesystem: ClassVar[bool] = False
    """True when a sandbox has a filesystem of its own (an image) that outlives its command: the
    workspace lives in it and is copied out afterwards, and the verifier runs in it after the harness
    (`SandboxHandle.exec`, `copy_in`, `copy_out`, `remove`; `find` and `reap` by labels)."""

    @classmethod
    @abstractmethod
    def create(cls, spec: LauncherSpec) -> SandboxLauncher:
        """The launcher of one service instance; `SandboxError` when this machine cannot run it."""

    @classmethod
    def check(cls, spec: LauncherSpec) -> str:
        """Before a run starts: what the launcher will use (its engine), or `SandboxError` saying why it
        cannot run here (`gyre up` exits 2 on it, before anything starts)."""
        cls.create(spec)
        return cls.name

    @classmethod
    def remove_all(cls, spec: LauncherSpec) -> int:
        """Remove every kept sandbox carrying `spec.labels` (a run that stops); returns how many."""
        return 0

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

    async def environment(self, task: Task) -> SandboxImage | None:
        """The image `task` runs in, built first where this launcher builds images; None for launchers
        that run commands on this host. `EnvironmentUnavailableError` when it cannot be had."""
        return None

    async def provision(self, spec: SandboxSpec) -> SandboxHandle:
        """A sandbox with its own filesystem prepared as `spec` says (image, copies, labels) but no command
        running in it yet: `exec` runs one (a verifier in a fresh sandbox)."""
        raise NotImplementedError(f"the {self.name} launcher has no sandbox filesystem")

    def home_inside(self, root: Path) -> Path:
        """The command's HOME as it sees it (`root` is the spec's host directory)."""
        return root / "home"

    async def find(self, labels: Mapping[str, str]) -> SandboxHandle | None:
        """The kept sandbox carrying `labels` (launchers with `own_filesystem`), None when there is none."""
        return None

    async def reap(self, labels: Mapping[str, str]) -> int:
        """Remove every kept sandbox carrying `labels`; returns how many there were."""
        return 0

    async def close(self) -> None:
        """Free what the launcher holds (connections); sandboxes are left as they are."""
        return None
