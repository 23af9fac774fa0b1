"""The `container` launcher: each sandbox a container of the task's own image, through the Docker Engine
API (dockerd, or podman's API service: `deploy/local/containers.sh`), on this host.

    launcher = make_launcher("container", LauncherSpec(section=box, labels={"gyre.run": run}, work_dir=run_dir))
    image = await launcher.images.ensure(task)            # built from environment/Dockerfile if missing
    handle = await launcher.launch(SandboxSpec(..., image=image, labels={"gyre.execution": eid}))
    outcome = await handle.wait(); await handle.release() # the harness ended; the container stays
    await handle.copy_out("/app", workspace)              # the preserved workspace
    handle = await launcher.find({"gyre.execution": eid}) # the evaluator, later: the verifier runs in it
    await handle.remove()

A container's main process is catatonit (a static init, mounted read-only) in pause mode, so the
container outlives its commands: the harness is exec'd into it, and after it the verifier, in the same
filesystem (Harbor's order). What is enforced is what `enforced()` says; the resources come from the
task's `[environment]` where it sets them, else from the `sandbox:` section. The runner must run as root
on the engine's host: the proxy relay enters the container's network namespace, and commands are
watched and stopped through the host's view of the container's processes (containers/processes.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import Mount, Ulimit

from gyre.config.runner import SandboxSection
from gyre.log import get_logger
from gyre.sandbox.containers import archive, engine
from gyre.sandbox.containers.handle import CONTROL, ContainerEngineLauncher, ContainerHandle
from gyre.sandbox.containers.images import ImageError, Images
from gyre.sandbox.launchers.base import (
    LABEL_RUN,
    LABEL_RUN_DIR,
    LABEL_SANDBOX,
    LauncherSpec,
    SandboxError,
    SandboxHandle,
    SandboxImage,
    SandboxSpec,
    SandboxState,
)
from gyre.tasks import Task, check_relative

log = get_logger("gyre.sandbox.container")

INIT_BINARIES = (Path("/usr/bin/catatonit"), Path("/usr/libexec/podman/catatonit"))
INIT_INSIDE = "/.gyre/init"
HOME_INSIDE = Path("/.gyre/home")
MIB = 1024 * 1024
NPROC = 32768
"""RLIMIT_NPROC of every container: podman's default, which it needs stated next to nofile on hosts
where it runs without CAP_SYS_RESOURCE. It bounds nothing (it counts a uid's processes host-wide, and root
ignores it): a container's processes are bounded by its pids limit."""


SUBID_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))


def _names_containers(path: Path) -> bool:
    """The file gives the user `containers` a range (what podman's rootful `--userns=auto` draws from)."""
    try:
        return any(line.split(":")[0].strip() == "containers" for line in path.read_text().splitlines())
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class ImageInfo:
    user: str
    path: str


def _name(labels: Mapping[str, str], sandbox: str) -> str:
    run = labels.get(LABEL_RUN, "")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"gyre-{run}-{sandbox}" if run else f"gyre-{sandbox}")[:200]


class ContainerLauncher(ContainerEngineLauncher):
    """Containers of the task's image; the proxy relayed into a network-less namespace; cgroup limits."""

    name = "container"
    isolates_network = True
    own_filesystem = True

    def __init__(self, section: SandboxSection, labels: Mapping[str, str], work_dir: Path | None) -> None:
        if os.geteuid() != 0:
            raise SandboxError(
                "the container launcher needs root: it enters its containers' network namespaces (the proxy "
                "relay) and signals their processes on this host"
            )
        found = [p for p in INIT_BINARIES if p.is_file()]
        if not found:
            raise SandboxError(
                "the container launcher needs catatonit (a static init): apt-get install catatonit"
            )
        self.init_binary = found[0]
        self.section = section
        self.settings = section.container
        self.endpoint = engine.resolve_endpoint(self.settings.endpoint)
        self.labels = {**engine.extra_labels(), **labels}
        self.images = Images(
            self._client_of,
            self.settings.default_image,
            work_dir / "builds" if work_dir is not None else None,
            self.settings.build_timeout_s,
            memory_mb=section.memory_mb,
            cpus=self.settings.cpus,
        )
        self._client: docker.DockerClient | None = None
        self._image_info: dict[str, ImageInfo] = {}
        self._storage_quota: bool | None = None
        self._userns_unsafe: str | None = None
        """Why userns=auto is not used on this engine ("" where it is); None until asked."""

    @classmethod
    def create(cls, spec: LauncherSpec) -> ContainerLauncher:
        return cls(spec.section, spec.labels, spec.work_dir)

    @classmethod
    def check(cls, spec: LauncherSpec) -> str:
        launcher = cls.create(spec)
        return f"{engine.describe(launcher.client)} at {launcher.endpoint}"

    @classmethod
    def remove_all(cls, spec: LauncherSpec) -> int:
        launcher = cls.create(spec)
        labels = {k: v for k, v in spec.labels.items() if k in (LABEL_RUN, LABEL_RUN_DIR)}
        if not labels:
            raise ValueError("removing sandboxes needs the run's labels")
        return engine.remove_labelled(launcher.client, labels)

    @property
    def userns_auto(self) -> bool:
        """`sandbox.container.userns: auto` and an engine that creates such containers safely (asked once;
        otherwise each container shares the host's user namespace, said at start and in `enforced`)."""
        if self.settings.userns != "auto":
            return False
        if self._userns_unsafe is None:
            missing = [str(f) for f in SUBID_FILES if not _names_containers(f)]
            self._userns_unsafe = engine.userns_auto_unsafe(self.client) or (
                f"{', '.join(missing)} give the user `containers` no range (bash deploy/local/containers.sh "
                "setup adds containers:2147483647:2147483648)"
                if missing
                else ""
            )
            if self._userns_unsafe:
                log.warning("container_userns_not_used", reason=self._userns_unsafe)
        return not self._userns_unsafe

    def _userns_said(self) -> str:
        try:
            if self.userns_auto:
                return ", in a user namespace of its own (container root is an unprivileged uid of this host)"
        except engine.ContainerEngineError as e:
            return f", a user namespace where the engine allows (not asked yet: {e})"
        why = f": {self._userns_unsafe}" if self._userns_unsafe else ""
        return f", no user namespace (container root is host root{why})"

    @property
    def client(self) -> docker.DockerClient:
        """The engine's client (connected on first use; `ContainerEngineError` naming the endpoint)."""
        if self._client is None:
            self._client = engine.connect(self.endpoint, self.settings.api_timeout_s)
        return self._client

    def _client_of(self, timeout_s: float | None) -> docker.DockerClient:
        return self.client if timeout_s is None else engine.connect(self.endpoint, timeout_s)

    def enforced(self) -> dict[str, str]:
        box = self.section
        return {
            "launcher": self.name,
            "engine": self.endpoint,
            "image": "the task's own: [environment] docker_image, else built from environment/Dockerfile "
            f"(tagged by the digest of the environment and its base images), else {self.settings.default_image}",
            "builds": self.images.enforced(),
            "user": (self.settings.user or "the image's USER") + self._userns_said(),
            "capabilities": "all dropped (a fresh verifier container keeps SETUID and SETGID, so its grader "
            "can run the agent's code as another user), no-new-privileges, never privileged; host paths "
            "mounted read-only (the init, the harness's binaries)",
            "network": "none but loopback, the proxy relayed to 127.0.0.1:<port>; the engine's default network "
            "too for a task with allow_internet = true",
            "memory": f"the container's cgroup: a task's memory_mb, else {box.memory_mb} MiB, no swap",
            "cpus": f"a task's cpus, else {self.settings.cpus or 'unlimited'}",
            "processes": f"pids limit {box.max_processes}",
            "storage": "a task's storage_mb where the engine's storage has quotas"
            + ("" if self._storage_quota is not False else " (not here: none applied)"),
            "rlimits": "CPU seconds, file size, open files per process, no core dumps",
            "gpus": "none (a task asking for GPUs is refused)",
            "lifecycle": "kept after the harness for the verifier; removed once the execution is evaluated, "
            "by `gyre down`, and by label when its owner restarts",
        }

    def home_inside(self, root: Path) -> Path:
        return HOME_INSIDE

    # -- launch --------------------------------------------------------------------------------
    async def environment(self, task: Task) -> SandboxImage:
        reference = await self.images.ensure(task)
        info = await asyncio.to_thread(self._image, reference)
        return SandboxImage(reference, self.images.holds_workspace(task), info.path)

    async def launch(self, spec: SandboxSpec) -> SandboxHandle:
        handle = await self.provision(spec)
        try:
            info = await asyncio.to_thread(self._image, spec.image or self.settings.default_image)
            env = {"HOME": str(HOME_INSIDE), "TMPDIR": "/tmp", "PATH": info.path, **spec.env}
            command = await handle.run("harness", spec.argv, str(spec.cwd), env, None)
        except BaseException:
            await handle.remove()
            raise
        handle.command = command
        handle.state = SandboxState(
            command.pid, command.started, None, str(spec.root), handle.state.container, "harness"
        )
        return handle

    async def provision(self, spec: SandboxSpec) -> ContainerHandle:
        if spec.binds:
            raise SandboxError("the container launcher copies paths in (copy_in) instead of binding them")
        gpus = int(spec.resources.get("gpus") or 0)
        if gpus > 0:
            raise SandboxError(f"the task asks for {gpus} GPU(s); the container launcher gives none")
        image = spec.image or self.settings.default_image
        await asyncio.to_thread(self._image, image)
        if spec.root.exists():
            await asyncio.to_thread(shutil.rmtree, spec.root)
        spec.control_dir.mkdir(parents=True)
        container = await asyncio.to_thread(self._create, spec, image)
        handle = ContainerHandle(self, SandboxState(0, -1, None, str(spec.root), container.id, ""), container)
        try:
            await self._prepare(handle, spec)
        except BaseException:
            await handle.remove()
            raise
        return handle

    def _image(self, image: str) -> ImageInfo:
        if image not in self._image_info:
            try:
                config = self.client.images.get(image).attrs.get("Config") or {}
            except docker.errors.ImageNotFound:
                raise ImageError(f"image {image} is not on this host") from None
            except (docker.errors.DockerException, OSError) as e:
                raise engine.ContainerEngineError(f"inspecting image {image}: {engine.why(e)}") from None
            env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
            path = env.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            self._image_info[image] = ImageInfo(config.get("User") or "", path)
        return self._image_info[image]

    def _create(self, spec: SandboxSpec, image: str) -> Container:
        """Create and start the container (a leftover of the same name, from a start interrupted by a
        crash, is removed first)."""
        labels = {**self.labels, **spec.labels, LABEL_SANDBOX: spec.name}
        config, host = self._create_args(spec, labels)
        api = self.client.api
        for attempt in (1, 2):
            try:
                host_config = api.create_host_config(**host)
                if self.userns_auto:  # podman's; the SDK only knows "host", so set it raw
                    host_config["UsernsMode"] = "auto"
                created = api.create_container(image, host_config=host_config, **config)
                api.start(created["Id"])
                # One inspect, after the start: the init's pid is in it (the SDK's run inspects twice).
                container: Container = self.client.containers.prepare_model(
                    api.inspect_container(created["Id"])
                )
                return container
            except docker.errors.APIError as e:
                text = engine.why(e)
                if attempt == 1 and e.status_code == 409:
                    engine.remove_labelled(self.client, {LABEL_SANDBOX: spec.name, **self.labels})
                    continue
                if attempt == 1 and "storage_opt" in host and "storage" in text.lower():
                    self._storage_quota = False
                    log.warning("container_storage_quota_unsupported", endpoint=self.endpoint, error=text)
                    host.pop("storage_opt")
                    continue
                raise SandboxError(f"creating a container of {image}: {text}") from None
            except (docker.errors.DockerException, OSError) as e:
                raise engine.ContainerEngineError(
                    f"creating a container of {image}: {engine.why(e)}"
                ) from None
        raise AssertionError("unreachable")

    def _create_args(
        self, spec: SandboxSpec, labels: dict[str, str]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The container's settings and its host settings (the engine API's two halves of a create)."""
        box, limits, res = self.section, spec.limits, spec.resources
        memory_mb = res.get("memory_mb") or box.memory_mb
        cpus = res.get("cpus") or self.settings.cpus
        storage_mb = res.get("storage_mb") or self.settings.storage_mb
        ulimits = [Ulimit(name="nproc", soft=NPROC, hard=NPROC), Ulimit(name="core", soft=0, hard=0)]
        for name, value in (
            ("nofile", limits.open_files),
            ("fsize", limits.file_size_mb * MIB if limits.file_size_mb else None),
            ("cpu", limits.cpu_s),
        ):
            if value is not None:
                ulimits.append(Ulimit(name=name, soft=int(value), hard=int(value)))
        mounts = [Mount(INIT_INSIDE, str(self.init_binary), type="bind", read_only=True)]
        mounts += [Mount(inside, str(source), type="bind", read_only=True) for source, inside in spec.tools]
        config: dict[str, Any] = {
            "entrypoint": [INIT_INSIDE, "-P"],
            "stop_signal": "SIGKILL",
            "command": [],
            "name": _name(labels, spec.name),
            "labels": labels,
            "working_dir": str(spec.cwd),
            "user": self.settings.user,
        }
        host: dict[str, Any] = {
            "network_mode": "bridge" if spec.network.egress else "none",
            "cap_drop": ["ALL"],
            "cap_add": ["SETUID", "SETGID"] if spec.change_user else [],
            "security_opt": ["no-new-privileges"],
            "privileged": False,
            "mounts": mounts,
            "ulimits": ulimits,
            "pids_limit": limits.max_processes or -1,
        }
        if memory_mb:
            host["mem_limit"] = host["memswap_limit"] = f"{int(memory_mb)}m"
        if cpus:
            host["nano_cpus"] = int(float(cpus) * 1e9)
        if storage_mb and self._storage_quota is not False:
            host["storage_opt"] = {"size": f"{int(storage_mb)}m"}
        return config, host

    async def _prepare(self, handle: ContainerHandle, spec: SandboxSpec) -> None:
        """The control directory, HOME with its files and the copied-in trees; then the proxy relay."""
        init = handle.init_pid(refresh=False)
        if init is None:
            raise SandboxError("the container stopped right after it started")
        await asyncio.to_thread(handle.resolve_user)
        entries: list[archive.Entry] = [archive.DirEntry(CONTROL.strip("/"), 0o755)]
        home = str(HOME_INSIDE).strip("/")
        entries.append(archive.DirEntry(home, 0o700))
        entries += [
            archive.FileEntry(f"{home}/{check_relative(rel).as_posix()}", content.encode())
            for rel, content in spec.home_files.items()
        ]
        entries += [archive.TreeEntry(source, inside.strip("/")) for source, inside in spec.copy_in]
        data = await asyncio.to_thread(archive.pack, entries, handle.uid, handle.gid)
        await asyncio.to_thread(handle.put, "/", data)
        if spec.network.mode == "proxy":
            net = spec.network
            await handle.start_relay(init, net.target_port, net.target_host, net.target_port)

    # -- re-attach, find, reap -----------------------------------------------------------------
    def attach(self, state: SandboxState) -> SandboxHandle:
        return ContainerHandle(self, state, None)

    def release(self, state: SandboxState) -> None:
        return None

    async def find(self, labels: Mapping[str, str]) -> SandboxHandle | None:
        found = await asyncio.to_thread(engine.find, self.client, {**self._run_labels(), **labels})
        if not found:
            return None
        container = found[0]
        handle = ContainerHandle(self, SandboxState(0, -1, None, "", container.id, "harness"), container)
        await asyncio.to_thread(handle.resolve_user)
        return handle

    async def reap(self, labels: Mapping[str, str]) -> int:
        return await asyncio.to_thread(engine.remove_labelled, self.client, {**self._run_labels(), **labels})

    def _run_labels(self) -> dict[str, str]:
        return {k: v for k, v in self.labels.items() if k in (LABEL_RUN, LABEL_RUN_DIR)}

    async def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
