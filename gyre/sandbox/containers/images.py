"""Task images: a task's `environment/Dockerfile` built by the engine, tagged by a digest of its
environment directory, so an unchanged task is built once per host.

    images = Images(client_of, default_image=LOCAL_BASE_IMAGE, logs_dir=run_dir / "builds", timeout_s=600)
    image = await images.ensure(task)      # the tag; built first if this host has no image of that digest
    result = await images.build(task)      # BuildResult(image, seconds, cached, log)

Which image a task runs in: `[environment] docker_image` as given when set (it must exist on the host or
be pullable); else the image built from `environment/Dockerfile` (FROM, RUN, ENV, WORKDIR, COPY/ADD,
multi-stage: everything the engine's builder does), tagged `localhost/gyre/env:<digest>`; else the
launcher's default image. A build that fails raises `ImageError` with one line naming the task, the step
that failed and the log file (the engine's whole output); the failure is remembered, so the task's later
executions fail at once with the same line instead of building again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from gyre.config.runner import ContainerSection
from gyre.sandbox.containers.engine import ContainerEngineError, connect, resolve_endpoint, why
from gyre.sandbox.launchers.base import EnvironmentUnavailableError
from gyre.tasks import Task

TAG_REPOSITORY = "localhost/gyre/env"
LABEL_DIGEST = "gyre.environment"
_STEP = re.compile(r"^(?:\[\d+/\d+\] )?(STEP \d+/\d+: .*|Step \d+/\d+ : .*)$")


class ImageError(EnvironmentUnavailableError):
    """The task's image could not be built or found; the message names the task and the step."""


@dataclass(frozen=True, slots=True)
class BuildResult:
    image: str
    seconds: float
    cached: bool
    """True when an image of this environment's digest was there already (nothing was built)."""
    log: Path | None


def environment_digest(env_dir: Path) -> str:
    """sha256 hex of the environment directory: each file's and symlink's relative path, whether it is
    executable, and its content (a symlink's target), in sorted order."""
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
    return digest.hexdigest()


def image_tag(env_dir: Path) -> str:
    return f"{TAG_REPOSITORY}:{environment_digest(env_dir)[:24]}"


def _safe_name(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", task_id)[:80]


class Images:
    """The images of one service's tasks (its own cache of failures and one build per tag at a time).
    `client_of(None)` is the service's client; `client_of(timeout_s)` a new one for a build (closed after)."""

    def __init__(
        self,
        client_of: Callable[[float | None], docker.DockerClient],
        default_image: str,
        logs_dir: Path | None,
        timeout_s: float,
    ) -> None:
        self._client_of = client_of
        self.default_image = default_image
        self.logs_dir = logs_dir
        self.timeout_s = timeout_s
        self._builds = ThreadPoolExecutor(max_workers=2, thread_name_prefix="image-build")
        """Builds run here, not in the event loop's default pool, which a long build would hold."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._failed: dict[str, str] = {}
        self._ready: set[str] = set()

    @classmethod
    def of_engine(cls, settings: ContainerSection, logs_dir: Path | None) -> Images:
        """Images of the engine `settings` name (`gyre tasks build`); `ContainerEngineError` when it
        does not answer."""
        endpoint = resolve_endpoint(settings.endpoint)
        client = connect(endpoint, settings.api_timeout_s)

        def client_of(timeout_s: float | None) -> docker.DockerClient:
            return client if timeout_s is None else connect(endpoint, timeout_s)

        return cls(client_of, settings.default_image, logs_dir, settings.build_timeout_s)

    def reference(self, task: Task) -> str:
        """The image `task` runs in (not checked for existence)."""
        env = task.environment
        if env.docker_image:
            return env.docker_image
        if env.dockerfile is not None:
            return image_tag(env.dockerfile.parent)
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
        image = self.reference(task)
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
        client = self._client_of(timeout_s)
        where = f"; log: {log}" if log is not None else ""
        loop = asyncio.get_running_loop()
        build = loop.run_in_executor(self._builds, _build_sync, client, task.task_id, context, image, log)
        try:
            await asyncio.wait_for(build, timeout_s)
        except TimeoutError:
            client.close()  # ends the stream the build thread reads
            raise ImageError(
                f"task {task.task_id}: image build ran past its {timeout_s:.0f} s timeout{where}"
            ) from None
        except ImageError as e:
            raise ImageError(f"{e}{where}") from None
        finally:
            client.close()


def _build_sync(
    client: docker.DockerClient, task_id: str, context: Path, image: str, log: Path | None
) -> None:
    """Run the build, writing the engine's output to `log`; `ImageError` naming the failing step."""
    step = "the build"
    with (log or Path(os.devnull)).open("w") as out:
        try:
            chunks: Any = client.api.build(
                path=str(context),
                dockerfile="Dockerfile",
                tag=image,
                decode=True,
                rm=True,
                forcerm=True,
                labels={LABEL_DIGEST: image.rsplit(":", 1)[-1]},
            )
            for chunk in chunks:
                text = chunk.get("stream") or ""
                out.write(text)
                for line in text.splitlines():
                    found = _STEP.match(line.strip())
                    if found:
                        step = found.group(1)
                error = chunk.get("error") or (chunk.get("errorDetail") or {}).get("message")
                if error:
                    out.write(f"ERROR: {error}\n")
                    raise ImageError(f"task {task_id}: image build failed at {step}: {_short(error)}")
        except (docker.errors.DockerException, OSError) as e:
            out.write(f"ERROR: {e}\n")
            raise ImageError(f"task {task_id}: image build failed at {step}: {why(e)}") from None


def _short(error: str) -> str:
    """The engine's error on one line (podman repeats the step it names first)."""
    line = " ".join(error.split())
    line = re.sub(r'^building at STEP "[^"]*": ', "", line)
    return line[:300]
