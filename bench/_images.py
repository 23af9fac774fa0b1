"""The images of `gyre bench cluster`, built with podman on a machine without an image registry.

    images = build_images(work_dir)       # gyre (deploy/docker/Dockerfile) + local stand-ins for nats, redis
    images.gyre, images.nats, images.redis, images.build_s

The Gyre image is built from deploy/docker/Dockerfile as a user builds it, with three build arguments that
keep the build off the network: the local Debian base (`BASE_IMAGE`), a wheelhouse of exactly the versions
this checkout's environment runs (`PIP_OFFLINE_DIR`: the runtime closure of `gyre[mooncake]`, fetched by
pip on the host, where HTTPS works — inside a container it does not on these machines) and the
node_modules that `make setup` installed (`NPM_OFFLINE_DIR`), both mounted at build time. NATS and Redis
are local stand-ins for the upstream images compose.yaml names (deploy/local/images/). Every image is
labelled `gyre.bench=cluster` and tagged `localhost/gyre-bench/…`; podman's layer cache makes a rebuild
of unchanged layers a matter of seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from gyre.paths import REPO_ROOT
from gyre.stack.servers import nats_server_binary

BASE_IMAGE = os.environ.get("GYRE_BASE_IMAGE", "localhost/gyre/debian-base:bookworm")
CONTAINERS_CONF = REPO_ROOT / "deploy" / "local" / "containers.conf"
IMAGE_LABEL = "gyre.bench=cluster"
IMAGE_PREFIX = "localhost/gyre-bench"
IMAGE_PYTHON = {"python_full_version": "3.11.2", "python_version": "3.11", "sys_platform": "linux"}
"""Debian bookworm's Python, which the image runs: dependency markers are evaluated for it."""


@dataclass(frozen=True, slots=True)
class ClusterImages:
    gyre: str
    nats: str
    redis: str
    build_s: dict[str, float]
    """Seconds each build took (wheelhouse included)."""


def podman_env() -> dict[str, str]:
    """The environment of every podman and podman-compose call: Gyre's containers.conf (runc, ulimits)."""
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def _closure(roots: list[str]) -> tuple[dict[str, str], set[str]]:
    """Installed versions of `roots` and everything they need on the image's Python; requirements of it
    that this environment does not have installed (markers of an older Python) stay unpinned."""
    pins: dict[str, str] = {}
    loose: set[str] = set()
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        key = (re.sub(r"[-_.]+", "-", req.name).lower(), tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            loose.add(f"{req.name}{req.specifier}")
            continue
        pins[key[0]] = dist.version
        envs = [{**IMAGE_PYTHON, "extra": e} for e in req.extras] or [{**IMAGE_PYTHON, "extra": ""}]
        for raw in dist.requires or []:
            dep = Requirement(raw)
            if dep.marker is None or any(dep.marker.evaluate(e) for e in envs):
                todo.append(dep)
    pins.pop("gyre", None)
    return pins, loose


WHEELHOUSE = Path.home() / ".cache" / "gyre" / "wheelhouse"
"""Kept between runs: fetched again only when the pinned set changes."""


def wheelhouse(directory: Path = WHEELHOUSE) -> Path:
    """Wheels of every package the image installs, at this environment's versions (pip on the host)."""
    pins, loose = _closure(["gyre[mooncake]", "grpcio-tools", "setuptools"])
    wanted = "\n".join([*(f"{n}=={v}" for n, v in sorted(pins.items())), *sorted(loose), "wheel"]) + "\n"
    done = directory / "requirements.done"
    if done.exists() and done.read_text() == wanted:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    reqs = directory / "requirements.txt"
    reqs.write_text(wanted)
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(directory), "-r", str(reqs)],
        capture_output=True,
        text=True,
    )
    if fetched.returncode != 0:
        raise RuntimeError(f"pip download of the image's wheels failed:\n{fetched.stderr[-3000:]}")
    done.write_text(wanted)
    return directory


def _build(tag: str, dockerfile: Path, context: Path, args: dict[str, str], volumes: list[str]) -> float:
    t0 = time.monotonic()
    argv = ["podman", "build", "-q", "-f", str(dockerfile), "-t", tag, "--label", IMAGE_LABEL]
    for k, v in args.items():
        argv += ["--build-arg", f"{k}={v}"]
    for v in volumes:
        argv += ["-v", v]
    done = subprocess.run([*argv, str(context)], env=podman_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"podman build of {tag} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return round(time.monotonic() - t0, 1)


def build_images(work: Path) -> ClusterImages:
    """Build the three images (the Gyre image with the host's wheelhouse and node_modules mounted)."""
    build_s: dict[str, float] = {}
    t0 = time.monotonic()
    wheels = wheelhouse()
    build_s["wheelhouse"] = round(time.monotonic() - t0, 1)
    node_modules = REPO_ROOT / "node_modules"
    if not (node_modules / "@anthropic-ai" / "claude-code").is_dir():
        raise RuntimeError(f"{node_modules} has no Claude Code: run `make setup` (npm ci) first")
    tags = {name: f"{IMAGE_PREFIX}/{name}:dev" for name in ("gyre", "nats", "redis")}
    build_s["gyre"] = _build(
        tags["gyre"],
        REPO_ROOT / "deploy" / "docker" / "Dockerfile",
        REPO_ROOT,
        {"BASE_IMAGE": BASE_IMAGE, "PIP_OFFLINE_DIR": "/wheels", "NPM_OFFLINE_DIR": "/node_modules"},
        [f"{wheels}:/wheels:ro", f"{node_modules}:/node_modules:ro"],
    )
    images_dir = REPO_ROOT / "deploy" / "local" / "images"
    nats_context = work / "nats-context"
    nats_context.mkdir(parents=True, exist_ok=True)
    shutil.copy2(nats_server_binary(), nats_context / "nats-server")
    build_s["nats"] = _build(
        tags["nats"], images_dir / "nats.Dockerfile", nats_context, {"BASE_IMAGE": BASE_IMAGE}, []
    )
    empty = work / "empty-context"
    empty.mkdir(parents=True, exist_ok=True)
    build_s["redis"] = _build(
        tags["redis"], images_dir / "redis.Dockerfile", empty, {"BASE_IMAGE": BASE_IMAGE}, []
    )
    return ClusterImages(tags["gyre"], tags["nats"], tags["redis"], build_s)
