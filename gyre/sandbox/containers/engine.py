"""The container engine, reached through the Docker Engine API (the `docker` SDK): dockerd and podman's
API service (`podman system service`) answer the same calls, so one code path serves both.

    endpoint = resolve_endpoint(None)          # DOCKER_HOST, else podman's socket, else docker's
    client = connect(endpoint, timeout_s=60)   # ContainerEngineError naming the endpoint
    remove_labelled(client, {"gyre.run": "r1"}) # every container of a run, wherever it stands

Containers carry labels (`LABEL_*` of gyre/sandbox/launchers/base.py): the run, the execution or verifier attempt they serve, and the
service instance that created them; every lookup and every cleanup filters on them, because the engine's
state is shared with whatever else runs on the host.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from gyre.sandbox.launchers.base import EXTRA_LABELS_ENV, EnvironmentUnavailableError

API_VERSION = "1.41"
"""The Docker Engine API version Gyre speaks: podman 4's API service and dockerd 20.10 and later answer it.
Stated, not negotiated: negotiating asks the engine's /version first, which podman answers only after
its storage lock, held for seconds while another user builds or removes images."""
PODMAN_SOCKET = Path("/run/podman/podman.sock")
DOCKER_SOCKET = Path("/var/run/docker.sock")


class ContainerEngineError(EnvironmentUnavailableError):
    """No container engine answers at the endpoint (or it refused a call); the message names it."""


def resolve_endpoint(configured: str | None) -> str:
    """The configured endpoint, else `DOCKER_HOST`, else podman's rootful socket if it exists, else
    docker's."""
    if configured:
        return configured
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    socket = PODMAN_SOCKET if PODMAN_SOCKET.exists() else DOCKER_SOCKET
    return f"unix://{socket}"


def connect(endpoint: str, timeout_s: float = 60.0) -> docker.DockerClient:
    """A client of the engine at `endpoint` that answered a ping."""
    try:
        client = docker.DockerClient(base_url=endpoint, version=API_VERSION, timeout=int(max(1, timeout_s)))
        client.ping()
    except (docker.errors.DockerException, OSError) as e:
        raise ContainerEngineError(f"no container engine answers at {endpoint}: {why(e)}") from None
    return client


def describe(client: docker.DockerClient) -> str:
    """`podman 4.3.1 (API 1.41)` or `docker 24.0.7 (API 1.43)`."""
    version: dict[str, Any] = client.version()
    components = {c.get("Name", "").lower() for c in version.get("Components", [])}
    kind = "podman" if any("podman" in c for c in components) else "docker"
    return f"{kind} {version.get('Version', '?')} (API {version.get('ApiVersion', '?')})"


USERNS_AUTO_SINCE = (4, 4)
"""podman releases whose API service creates `--userns=auto` containers safely: 4.3.1's can deadlock holding
userns.lock and the storage locks while another client creates or cleans up containers (every later call of
every client then hangs; containers/podman#16062, fixed in 4.4; seen here with two suites at once)."""


def userns_auto_unsafe(client: docker.DockerClient) -> str | None:
    """Why the engine must not be asked for `userns=auto`, or None where it may: dockerd has no such mode;
    podman before 4.4 deadlocks (USERNS_AUTO_SINCE)."""
    try:
        version: dict[str, Any] = client.version()
    except (docker.errors.DockerException, OSError) as e:
        raise ContainerEngineError(f"asking the engine its version: {why(e)}") from None
    components = {c.get("Name", "").lower() for c in version.get("Components", [])}
    if not any("podman" in c for c in components):
        return f"{describe(client)} has no userns=auto (dockerd remaps users daemon-wide: userns-remap)"
    numbers = tuple(int(x) for x in re.findall(r"\d+", str(version.get("Version", "0")))[:2])
    if numbers < USERNS_AUTO_SINCE:
        return (
            f"podman {version.get('Version')} can deadlock creating userns=auto containers "
            "(containers/podman#16062, fixed in 4.4)"
        )
    return None


def extra_labels() -> dict[str, str]:
    """Labels from `GYRE_SANDBOX_LABELS`; a malformed entry is a `ValueError` naming it."""
    out: dict[str, str] = {}
    for item in filter(None, os.environ.get(EXTRA_LABELS_ENV, "").split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{EXTRA_LABELS_ENV}: {item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def label_filter(labels: Mapping[str, str]) -> dict[str, list[str]]:
    return {"label": [f"{k}={v}" for k, v in labels.items()]}


LIST_ATTEMPTS = 5
"""podman 4.3 fails a whole list with "no such container" when a container it lists is removed meanwhile;
the list is asked again (each removal racing it makes one retry)."""


def find(client: docker.DockerClient, labels: Mapping[str, str]) -> list[Container]:
    """Every container (running or not) carrying all of `labels`. One removed while it is listed is left
    out: the SDK's NotFound on inspecting it is ignored, and the engine's own failure retried. Without
    both, a reap racing another removal (two evaluator workers, `gyre down` and the evaluator) failed,
    and left its container running."""
    error: Exception | None = None
    for _ in range(LIST_ATTEMPTS):
        try:
            found: list[Container] = client.containers.list(
                all=True, filters=label_filter(labels), ignore_removed=True
            )
            return found
        except (docker.errors.DockerException, OSError) as e:
            error = e
            if not (isinstance(e, docker.errors.APIError) and "no such container" in str(e)):
                break
    assert error is not None
    raise ContainerEngineError(f"listing containers {dict(labels)}: {why(error)}")


REMOVE_BUSY_S = 15.0
"""How long a removal is retried while the engine reports the container's mounts busy."""


def remove(container: Container) -> None:
    """Remove, running or not (Gyre's containers stop with SIGKILL: their init has nothing to save); a
    container already gone is not an error."""
    deadline = time.monotonic() + REMOVE_BUSY_S
    while True:
        try:
            container.remove(force=True, v=True)
            return
        except docker.errors.NotFound:
            return
        except (docker.errors.DockerException, OSError) as e:
            # podman 4.3 with a user namespace (userns=auto) sometimes finds the container's /dev/shm
            # mount still busy right after the kill; the same call succeeds once it is released.
            if "device or resource busy" in str(e) and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise ContainerEngineError(f"removing container {container.name}: {why(e)}") from None


def remove_labelled(client: docker.DockerClient, labels: Mapping[str, str]) -> int:
    """Remove every container carrying `labels` (a few at once); returns how many there were."""
    found = find(client, labels)
    if len(found) > 1:
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(remove, found))
    elif found:
        remove(found[0])
    return len(found)


_REASONS = (
    ("FileNotFoundError", "no such socket"),
    ("ConnectionRefusedError", "connection refused"),
    ("Connection refused", "connection refused"),
    ("PermissionError", "permission denied"),
    ("Read timed out", "no answer within the API timeout"),
)


def why(error: BaseException) -> str:
    """One line saying what went wrong in an engine call (its innermost cause where it is known)."""
    text = str(error)
    if isinstance(error, docker.errors.APIError) and error.explanation:
        text = str(error.explanation)
    for marker, reason in _REASONS:
        if marker in text:
            return reason
    return text.strip().splitlines()[0][:300] if text.strip() else type(error).__name__
