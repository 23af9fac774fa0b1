"""Task images: a task's `environment/Dockerfile` built by the engine, tagged by a digest of its
environment directory and of the images it builds from, so an unchanged task is built once per host.

    images = Images(client_of, default_image=LOCAL_BASE_IMAGE, logs_dir=run_dir / "builds", timeout_s=600,
                    memory_mb=4096, cpus=1.0)
    image = await images.ensure(task)      # the tag; built first if this host has no image of that digest
    result = await images.build(task)      # BuildResult(image, seconds, cached, log)

Which image a task runs in: `[environment] docker_image` as given when set (it must exist on the host or
be pullable); else the image built from `environment/Dockerfile` (FROM, RUN, ENV, WORKDIR, COPY/ADD,
multi-stage: everything the engine's builder does), tagged `localhost/gyre/env:<digest>`; else the
launcher's default image. The digest covers the environment directory (paths, modes, contents) and the id
of every image the Dockerfile builds from (each FROM and COPY --from that names an image rather than a
stage, global ARG defaults substituted), as the engine resolves it when the task is looked up: a base
rebuilt under the same name gives a new tag, so the task is built again on it. A base not on the host
counts as absent (the engine pulls it while building, and the task's next lookup, finding it, builds once
more through the layer cache).

A build that fails raises `ImageError` with one line naming the task, the step that failed and the log file
(the engine's whole output); the failure is remembered, so the task's later executions fail at once with
the same line instead of building again.

The Dockerfile is the task author's but its RUN steps are arbitrary code from a dataset, so a build runs
bounded (verified against podman 4.3's Docker-compatible build endpoint, tests/integration/
test_container_images.py):
- network: none but loopback unless the task says `[environment] allow_internet = true`. podman's compat
  endpoint ignores Docker's `networkmode=none` (it maps only its own policy names, and its compat builds
  otherwise run RUN steps in the *host's* network namespace), so podman is sent `networkmode=NetworkDisabled`
  (a fresh namespace, loopback only) and dockerd `none`; an allowed build gets its own namespace on the
  engine's default bridge network (podman: `nsoptions` network not host, `NetworkEnabled`), never the host's.
  The engine itself still resolves and pulls FROM images.
- memory: the task's `memory_mb`, else the sandbox default (`sandbox.memory_mb`), swap none (`memory`,
  `memswap`: the RUN step's cgroup limit).
- cpu: the task's `cpus`, else `sandbox.container.cpus`, as a CFS quota (`cpuquota`/`cpuperiod`).
- timeout: the task's `build_timeout_sec`, else `sandbox.container.build_timeout_s`. podman 4.3 does not
  stop a build whose client goes away (its RUN step keeps running, the build goes on to commit), so each
  podman build runs its steps in a cgroup of its own (`cgroupparent=gyre-build-<id>`) and, past the timeout,
  every process in that cgroup is SIGKILLed (this host's /proc; the engine runs here, as root) until the
  build's stream ends: the failed step ends the build, its working container removed. The request itself
  is never dropped on podman 4.3: its compat handler writes the build's output through unbuffered channels
  whose writer holds a mutex while it waits for the reader, so a client that goes away mid-build can leave
  the handler's deferred Close and the build both blocked for good, the build holding the storage lock
  (every later call of the engine then hangs). On dockerd the request is dropped, which cancels
  the build there. Either way the execution gets `ImageError` "ran past its N s timeout".
Not enforced on builds: a pids limit, disk (the layer the build writes, the context's size), ulimits
beyond the engine's defaults, a user namespace (a RUN step is root in its container as the engine
builds it), and what the engine does itself (pulling the base, committing layers), which the timeout
only stops at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.utils

from gyre.config.runner import ContainerSection, SandboxSection
from gyre.sandbox.containers.engine import ContainerEngineError, connect, resolve_endpoint, why
from gyre.sandbox.launchers.base import EnvironmentUnavailableError
from gyre.tasks import Task

TAG_REPOSITORY = "localhost/gyre/env"
LABEL_DIGEST = "gyre.environment"
CGROUP_PREFIX = "gyre-build-"
"""The cgroup each podman build runs its RUN steps in (`cgroupparent`): how its processes are found."""
CPU_PERIOD_US = 100_000
KILL_GRACE_S = 30.0
"""After the timeout, how long the build's processes are killed (and its stream awaited) before the
request is dropped."""
_STEP = re.compile(r"^(?:\[\d+/\d+\] )?(STEP \d+/\d+: .*|Step \d+/\d+ : .*)$")
_VARIABLE = re.compile(r"\$\{(\w+)(?::?([-+])([^}]*))?\}|\$(\w+)")


class ImageError(EnvironmentUnavailableError):
    """The task's image could not be built or found; the message names the task and the step."""


@dataclass(frozen=True, slots=True)
class BuildResult:
    image: str
    seconds: float
    cached: bool
    """True when an image of this environment's digest was there already (nothing was built)."""
    log: Path | None


def environment_digest(env_dir: Path, bases: Mapping[str, str]) -> str:
    """sha256 hex of the environment directory (each file's and symlink's relative path, whether it is
    executable, and its content (a symlink's target), in sorted order) and of `bases`: each image the
    Dockerfile builds from → its id on the engine ("" where it has none)."""
    digest = hashlib.sha256()
    entries: list[Path] = []
    for root, dirs, files in os.walk(env_dir):
        dirs.sort()
        entries.extend(Path(root, name) for name in files)
        entries.extend(Path(root, name) for name in dirs if Path(root, name).is_symlink())
    for path in sorted(entries, key=lambda p: p.relative_to(env_dir).as_posix()):
        digest.update(path.relative_to(env_dir).as_posix().encode("utf-8", "surrogateescape") + b"\0")
        if path.is_symlink():
            digest.update(b"L" + os.readlink(path).encode("utf-8", "surrogateescape") + b"\0")
        else:
            digest.update(b"X" if os.access(path, os.X_OK) else b"F")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    for name in sorted(bases):
        digest.update(f"\0FROM {name}={bases[name]}".encode())
    return digest.hexdigest()


def image_tag(env_dir: Path, bases: Mapping[str, str]) -> str:
    return f"{TAG_REPOSITORY}:{environment_digest(env_dir, bases)[:24]}"


def dockerfile_images(text: str) -> list[str]:
    """The images a Dockerfile builds from, in order: each FROM and COPY --from that names an image (not
    `scratch`, not an earlier stage's name or index), with the global ARGs' defaults substituted."""
    escape = "\\"
    lines = text.splitlines()
    for line in lines:  # parser directives, before anything else
        found = re.fullmatch(r"\s*#\s*(\w+)\s*=\s*(\S+)\s*", line)
        if not found:
            break
        if found.group(1).lower() == "escape":
            escape = found.group(2)
    instructions: list[str] = []
    pending = ""
    for line in lines:
        if line.lstrip().startswith("#") or (pending and not line.strip()):
            continue
        stripped = line.rstrip()
        if stripped.endswith(escape):
            pending += stripped[: -len(escape)] + " "
            continue
        if (pending + line).strip():
            instructions.append((pending + line).strip())
        pending = ""
    if pending.strip():
        instructions.append(pending.strip())

    args: dict[str, str] = {}
    stages: set[str] = set()
    count = 0
    images: list[str] = []

    def substitute(word: str) -> str:
        def value(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(4)
            have = args.get(name, "")
            if m.group(2) == "-":
                return have or m.group(3)
            if m.group(2) == "+":
                return m.group(3) if have else ""
            return have

        return _VARIABLE.sub(value, word)

    def add(name: str) -> None:
        if name and name.lower() != "scratch" and name.lower() not in stages and name not in images:
            images.append(name)

    for instruction in instructions:
        keyword, _, rest = instruction.partition(" ")
        keyword = keyword.upper()
        words = rest.split()
        if keyword == "ARG" and count == 0:
            for word in words:
                name, sep, default = word.partition("=")
                args[name] = substitute(default.strip("\"'")) if sep else args.get(name, "")
        elif keyword == "FROM":
            plain = [w for w in words if not w.startswith("--")]
            if plain:
                add(substitute(plain[0]))
            if len(plain) >= 3 and plain[1].lower() == "as":
                stages.add(plain[2].lower())
            stages.add(str(count))
            count += 1
        elif keyword == "COPY":
            for word in words:
                if word.startswith("--from="):
                    add(substitute(word.removeprefix("--from=")))
    return images


def build_params(
    podman: bool,
    allow_internet: bool,
    memory_mb: int | None,
    cpus: float | None,
    cgroup: str | None,
) -> dict[str, Any]:
    """The build endpoint's query parameters that bound a build (module docstring): `podman` is the
    engine's kind (its compat endpoint names network policies its own way); `cgroup` the cgroup its steps
    run in (podman only)."""
    params: dict[str, Any] = {}
    if podman:
        if allow_internet:
            params["networkmode"] = "NetworkEnabled"
            params["nsoptions"] = json.dumps([{"Name": "network", "Host": False, "Path": ""}])
        else:
            params["networkmode"] = "NetworkDisabled"
        if cgroup:
            params["cgroupparent"] = cgroup
    elif not allow_internet:
        params["networkmode"] = "none"
    if memory_mb is not None:
        params["memory"] = params["memswap"] = int(memory_mb) << 20
    if cpus is not None:
        params["cpuperiod"] = CPU_PERIOD_US
        params["cpuquota"] = max(1000, round(cpus * CPU_PERIOD_US))
    return params


def _safe_name(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", task_id)[:80]


class Images:
    """The images of one service's tasks (its own cache of failures and one build per tag at a time).
    `client_of(None)` is the service's client; `client_of(timeout_s)` a new one for a build (closed after).
    `memory_mb` and `cpus` bound a build whose task names none (None: unbounded)."""

    def __init__(
        self,
        client_of: Callable[[float | None], docker.DockerClient],
        default_image: str,
        logs_dir: Path | None,
        timeout_s: float,
        memory_mb: int | None = None,
        cpus: float | None = None,
    ) -> None:
        self._client_of = client_of
        self.default_image = default_image
        self.logs_dir = logs_dir
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.cpus = cpus
        self._builds = ThreadPoolExecutor(max_workers=2, thread_name_prefix="image-build")
        """Builds run here, not in the event loop's default pool, which a long build would hold."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._failed: dict[str, str] = {}
        self._ready: set[str] = set()
        self._podman: bool | None = None

    @classmethod
    def of_engine(cls, sandbox: SandboxSection, logs_dir: Path | None) -> Images:
        """Images of the engine `sandbox.container` names (`gyre tasks build`), builds bounded by the
        sandbox's defaults; `ContainerEngineError` when it does not answer."""
        settings: ContainerSection = sandbox.container
        endpoint = resolve_endpoint(settings.endpoint)
        client = connect(endpoint, settings.api_timeout_s)

        def client_of(timeout_s: float | None) -> docker.DockerClient:
            return client if timeout_s is None else connect(endpoint, timeout_s)

        return cls(
            client_of,
            settings.default_image,
            logs_dir,
            settings.build_timeout_s,
            memory_mb=sandbox.memory_mb,
            cpus=settings.cpus,
        )

    def enforced(self) -> str:
        """What bounds a build, in words (the launcher's `enforced()`)."""
        memory = f"{self.memory_mb} MiB" if self.memory_mb is not None else "unlimited"
        return (
            "no network but loopback unless the task allows the internet; memory: a task's memory_mb, else "
            f"{memory}; cpus: a task's cpus, else {self.cpus or 'unlimited'}; past its timeout (a task's "
            f"build_timeout_sec, else {self.timeout_s:g} s) its processes are killed on the engine"
        )

    async def reference(self, task: Task) -> str:
        """The image `task` runs in (not checked for existence): its own tag is resolved through the
        engine, which names the ids of the images its Dockerfile builds from."""
        env = task.environment
        if env.docker_image:
            return env.docker_image
        if env.dockerfile is not None:
            dockerfile = env.dockerfile
            bases = await asyncio.to_thread(self._bases, dockerfile)
            return image_tag(dockerfile.parent, bases)
        return self.default_image

    def holds_workspace(self, task: Task) -> bool:
        """True when the image itself holds the task's workspace (built from the task's Dockerfile, whose
        COPY steps put it there), so nothing needs copying in."""
        return not task.environment.docker_image and task.environment.dockerfile is not None

    def remove(self, image: str) -> None:
        """Remove an image this process built (and the layers only it used)."""
        with contextlib.suppress(docker.errors.ImageNotFound):
            self._client_of(None).images.remove(image)
        self._ready.discard(image)

    async def ensure(self, task: Task) -> str:
        """The task's image, built first when it is the task's own and missing; `ImageError` otherwise."""
        return (await self.build(task)).image

    async def build(self, task: Task, force: bool = False) -> BuildResult:
        """Build the task's image unless this host has it (`force`: build again through the engine's
        layer cache); a task without a Dockerfile only checks that its image exists."""
        image = await self.reference(task)
        if image in self._failed:
            raise ImageError(self._failed[image])
        lock = self._locks.setdefault(image, asyncio.Lock())
        async with lock:
            began = time.monotonic()
            if not force and (image in self._ready or await self._exists(image)):
                self._ready.add(image)
                return BuildResult(image, time.monotonic() - began, True, None)
            if not self.holds_workspace(task):
                error = (
                    f"task {task.task_id}: image {image} is not on this host (and no Dockerfile builds it)"
                )
                raise ImageError(error)
            assert task.environment.dockerfile is not None
            timeout_s = task.environment.build_timeout_s or self.timeout_s
            log = self._log_path(task, image)
            try:
                await self._build(task, task.environment.dockerfile.parent, image, log, timeout_s)
            except ImageError as e:
                self._failed[image] = str(e)
                raise
            self._ready.add(image)
            return BuildResult(image, time.monotonic() - began, False, log)

    def _bases(self, dockerfile: Path) -> dict[str, str]:
        """Each image the Dockerfile builds from → its id on the engine, "" where it has none."""
        client = self._client_of(None)
        bases: dict[str, str] = {}
        for name in dockerfile_images(dockerfile.read_text(errors="replace")):
            try:
                bases[name] = client.images.get(name).id or ""
            except (docker.errors.ImageNotFound, docker.errors.NullResource):
                bases[name] = ""
            except docker.errors.APIError as e:
                if e.status_code is not None and 400 <= e.status_code < 500:
                    bases[name] = ""  # not a valid reference: the build names it
                else:
                    raise ContainerEngineError(f"inspecting image {name}: {why(e)}") from None
            except (docker.errors.DockerException, OSError) as e:
                raise ContainerEngineError(f"inspecting image {name}: {why(e)}") from None
        return bases

    async def _exists(self, image: str) -> bool:
        def inspect() -> bool:
            try:
                self._client_of(None).images.get(image)
            except docker.errors.ImageNotFound:
                return False
            except (docker.errors.DockerException, OSError) as e:
                raise ContainerEngineError(f"inspecting image {image}: {why(e)}") from None
            return True

        return await asyncio.to_thread(inspect)

    def _log_path(self, task: Task, image: str) -> Path | None:
        if self.logs_dir is None:
            return None
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        return self.logs_dir / f"{_safe_name(task.task_id)}-{image.rsplit(':', 1)[-1][:12]}.log"

    async def _build(self, task: Task, context: Path, image: str, log: Path | None, timeout_s: float) -> None:
        # A read timeout past the kill's: the engine ends the stream (a podman build is never dropped).
        client = self._client_of(timeout_s + KILL_GRACE_S + 60)
        where = f"; log: {log}" if log is not None else ""
        build: asyncio.Future[None] | None = None
        try:
            if self._podman is None:
                self._podman = await asyncio.to_thread(_is_podman, client)
            env = task.environment
            cgroup = f"{CGROUP_PREFIX}{uuid.uuid4().hex[:16]}" if self._podman else None
            params = build_params(
                self._podman,
                bool(env.allow_internet),
                env.memory_mb if env.memory_mb is not None else self.memory_mb,
                env.cpus if env.cpus is not None else self.cpus,
                cgroup,
            )
            request = _BuildRequest(client, task.task_id, context, image, log, params)
            loop = asyncio.get_running_loop()
            build = loop.run_in_executor(self._builds, request.run)
            try:
                await asyncio.wait_for(asyncio.shield(build), timeout_s)
            except TimeoutError:
                killed = await _stop(build, request, cgroup)
                if log is not None:
                    with log.open("a") as out:
                        out.write(
                            f"gyre: past the {timeout_s:g} s timeout: {killed} build process(es) killed\n"
                        )
                raise ImageError(
                    f"task {task.task_id}: image build ran past its {timeout_s:.0f} s timeout{where}"
                ) from None
            except ImageError as e:
                raise ImageError(f"{e}{where}") from None
        finally:
            if build is None or build.done():
                client.close()
            else:  # still reading the engine's stream (module docstring): closed when it ends
                build.add_done_callback(lambda _: client.close())


def _is_podman(client: docker.DockerClient) -> bool:
    """True when the engine is podman's API service (its ping says so in a header; no storage lock)."""
    api = client.api
    try:
        response = api._get(api._url("/_ping"))
    except (docker.errors.DockerException, OSError) as e:
        raise ContainerEngineError(f"pinging the engine: {why(e)}") from None
    return "Libpod-Api-Version" in response.headers


async def _stop(build: asyncio.Future[None], request: _BuildRequest, cgroup: str | None) -> int:
    """End a build past its timeout; how many of its processes were killed. podman: kill every process
    of its cgroup until its stream ends (at most `KILL_GRACE_S`), never dropping the request (module
    docstring); dockerd: drop the request, which cancels the build there."""
    killed = 0
    deadline = time.monotonic() + KILL_GRACE_S
    if cgroup is None:
        request.disconnect()
    while not build.done() and time.monotonic() < deadline:
        if cgroup is not None:
            killed += await asyncio.to_thread(kill_cgroup, cgroup)
        await asyncio.wait([build], timeout=0.2)
    if cgroup is not None:
        killed += await asyncio.to_thread(kill_cgroup, cgroup)
    if build.done() and not build.cancelled():
        build.exception()  # retrieved: the killed step's failure is the timeout's consequence
    else:
        build.add_done_callback(lambda f: f.cancelled() or f.exception())
    return killed


def cgroup_pids(name: str, proc: Path = Path("/proc")) -> list[int]:
    """The processes of this host in a cgroup named `name` (a path component, any hierarchy)."""
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(proc):
            if not entry.name.isdigit():
                continue
            try:
                text = Path(entry.path, "cgroup").read_text()
            except OSError:
                continue
            if any(name in line.split(":", 2)[-1].split("/") for line in text.splitlines()):
                pids.append(int(entry.name))
    return pids


def kill_cgroup(name: str) -> int:
    """SIGKILL every process in the cgroup `name`; how many were signalled."""
    killed = 0
    for pid in cgroup_pids(name):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


class _BuildRequest:
    """One build through the engine's API, run in a thread (`run`), which the event loop may
    `disconnect`."""

    def __init__(
        self,
        client: docker.DockerClient,
        task_id: str,
        context: Path,
        image: str,
        log: Path | None,
        params: Mapping[str, Any],
    ) -> None:
        self.client = client
        self.task_id = task_id
        self.context = context
        self.image = image
        self.log = log
        self.params = params
        self.response: Any = None

    def disconnect(self) -> None:
        """Drop the request: the thread reading its stream gets an error and ends."""
        response = self.response
        if response is None:
            return
        with contextlib.suppress(Exception):
            sock = self.client.api._get_raw_response_socket(response)
            getattr(sock, "_sock", sock).shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            response.close()

    def run(self) -> None:
        """Run the build, writing the engine's output to the log; `ImageError` naming the failing step."""
        step = "the build"
        with (self.log or Path(os.devnull)).open("w") as out:
            try:
                for chunk in self._chunks():
                    text = chunk.get("stream") or ""
                    out.write(text)
                    for line in text.splitlines():
                        found = _STEP.match(line.strip())
                        if found:
                            step = found.group(1)
                    error = chunk.get("error") or (chunk.get("errorDetail") or {}).get("message")
                    if error:
                        out.write(f"ERROR: {error}\n")
                        raise ImageError(
                            f"task {self.task_id}: image build failed at {step}: {_short(error)}"
                        )
            except (docker.errors.DockerException, OSError, ValueError) as e:
                out.write(f"ERROR: {e}\n")
                raise ImageError(f"task {self.task_id}: image build failed at {step}: {why(e)}") from None

    def _chunks(self) -> Any:
        """The engine's decoded output: `client.api.build`'s request (the context a tar of the directory
        less its .dockerignore), with the parameters the SDK does not pass (cpuquota, cgroupparent,
        nsoptions)."""
        api = self.client.api
        ignore = self.context / ".dockerignore"
        exclude = None
        if ignore.exists():
            lines = (line.strip() for line in ignore.read_text().splitlines())
            exclude = [line for line in lines if line and not line.startswith("#")]
        tar = docker.utils.tar(str(self.context), exclude=exclude, dockerfile=("Dockerfile", None))
        params = {
            "t": self.image,
            "dockerfile": "Dockerfile",
            "rm": True,
            "forcerm": True,
            "labels": json.dumps({LABEL_DIGEST: self.image.rsplit(":", 1)[-1]}),
            **self.params,
        }
        headers = {"Content-Type": "application/tar"}
        api._set_auth_headers(headers)
        try:
            self.response = api._post(
                api._url("/build"), data=tar, params=params, headers=headers, stream=True
            )
        finally:
            tar.close()
        api._raise_for_status(self.response)
        return api._stream_helper(self.response, decode=True)


def _short(error: str) -> str:
    """The engine's error on one line (podman repeats the step it names first)."""
    line = " ".join(error.split())
    line = re.sub(r'^building at STEP "[^"]*": ', "", line)
    return line[:300]
