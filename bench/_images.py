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

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from app.stack.servers import nats_server_binary
from gyre.paths import REPO_ROOT

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
    """Seconds until each image was tagged (and the wheelhouse's)."""
    builds: list[subprocess.Popen[str]] = field(default_factory=list)
    """The build processes, which may still be cleaning up (`finish_builds`)."""


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
"""Kept between runs: what the pinned set lacks is fetched when it changes."""
WHEELHOUSE_JOBS = 4


DOCKERFILE = REPO_ROOT / "deploy" / "docker" / "Dockerfile"


def dockerfile_arg(name: str) -> str:
    """The default of `ARG name=...` in deploy/docker/Dockerfile."""
    found = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.M)
    if found is None:
        raise RuntimeError(f"{DOCKERFILE} has no ARG {name} with a default")
    return found.group(1).strip('"')


def wheelhouse(directory: Path = WHEELHOUSE) -> Path:
    """Wheels of every package the image installs, at this environment's versions (pip on the host), and
    the uv the Dockerfile installs them with."""
    roots = ["gyre[mooncake]", "grpcio-tools", "setuptools", f"uv=={dockerfile_arg('UV_VERSION')}"]
    pins, loose = _closure(roots)
    wanted = "\n".join([*(f"{n}=={v}" for n, v in sorted(pins.items())), *sorted(loose), "wheel"]) + "\n"
    done = directory / "requirements.done"
    if done.exists() and done.read_text() == wanted:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    have = set()
    for wheel in directory.glob("*.whl"):
        with contextlib.suppress(InvalidWheelFilename):
            name, version, _build_tag, _tags = parse_wheel_filename(wheel.name)
            have.add((name, version))
    todo = [f"{n}=={v}" for n, v in sorted(pins.items()) if (canonicalize_name(n), Version(v)) not in have]
    todo += [*sorted(loose), "wheel"]
    # pip looks a package up at a time: four at once cut a fresh wheelhouse's ~80 s to ~25 s here.
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(directory)]
    fetches = [
        subprocess.Popen([*argv, *todo[i::WHEELHOUSE_JOBS]], stderr=subprocess.PIPE, text=True)
        for i in range(WHEELHOUSE_JOBS)
        if todo[i::WHEELHOUSE_JOBS]
    ]
    errors = [err for f in fetches if (err := f.communicate()[1]) and f.returncode != 0]
    if errors:
        raise RuntimeError(f"pip download of the image's wheels failed:\n{errors[0][-3000:]}")
    (directory / "requirements.txt").write_text(wanted)
    done.write_text(wanted)
    return directory


def _build(
    tag: str,
    dockerfile: Path,
    context: Path,
    args: dict[str, str],
    volumes: list[str],
    log: Path,
    cold: bool,
) -> subprocess.Popen[str]:
    """Start `podman build`; its output goes to `log`, each line with the seconds since the start (where
    a cold build spends its time, step by step)."""
    argv = ["podman", "build", "--layers", "-f", str(dockerfile), "-t", tag, "--label", IMAGE_LABEL]
    if cold:
        argv.append("--no-cache")
    for k, v in args.items():
        argv += ["--build-arg", f"{k}={v}"]
    for v in volumes:
        argv += ["-v", v]
    stamp = (
        "import sys, time\n"
        "t0 = time.monotonic()\n"
        "for line in sys.stdin:\n"
        "    sys.stdout.write(f'{time.monotonic() - t0:7.1f} {line}')\n"
        "    sys.stdout.flush()\n"
    )
    build = subprocess.Popen(
        [*argv, str(context)], env=podman_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    with open(log, "w") as out:
        subprocess.Popen([sys.executable, "-c", stamp], stdin=build.stdout, stdout=out)
    assert build.stdout is not None
    build.stdout.close()  # the stamper holds the pipe now
    return build


def build_images(work: Path, tag: str, log_dir: Path, cold: bool = False) -> ClusterImages:
    """Build the three images at once (the Gyre image with the host's wheelhouse and node_modules mounted),
    tagged `tag`; `untag_images` removes the names again (the layers stay: the next build's cache)."""
    build_s: dict[str, float] = {}
    t0 = time.monotonic()
    wheels = wheelhouse()
    build_s["wheelhouse"] = round(time.monotonic() - t0, 1)
    node_modules = REPO_ROOT / "node_modules"
    if not (node_modules / "@anthropic-ai" / "claude-code").is_dir():
        raise RuntimeError(f"{node_modules} has no Claude Code: run `make setup` (npm ci) first")
    tags = {name: f"{IMAGE_PREFIX}/{name}:{tag}" for name in ("gyre", "nats", "redis")}
    images_dir = REPO_ROOT / "deploy" / "local" / "images"
    nats_context = work / "nats-context"
    nats_context.mkdir(parents=True, exist_ok=True)
    shutil.copy2(nats_server_binary(), nats_context / "nats-server")
    empty = work / "empty-context"
    empty.mkdir(parents=True, exist_ok=True)
    base = {"BASE_IMAGE": BASE_IMAGE}
    t1 = time.monotonic()
    builds = {
        "gyre": _build(
            tags["gyre"],
            DOCKERFILE,
            REPO_ROOT,
            {**base, "PIP_OFFLINE_DIR": "/wheels", "NPM_OFFLINE_DIR": "/node_modules"},
            [f"{wheels}:/wheels:ro", f"{node_modules}:/node_modules:ro"],
            log_dir / "build-gyre.log",
            cold,
        ),
        "nats": _build(
            tags["nats"],
            images_dir / "nats.Dockerfile",
            nats_context,
            base,
            [],
            log_dir / "build-nats.log",
            cold,
        ),
        "redis": _build(
            tags["redis"], images_dir / "redis.Dockerfile", empty, base, [], log_dir / "build-redis.log", cold
        ),
    }
    # An image can be used once podman says it is tagged: podman then still removes the build's working
    # containers (a minute or more for the 1.3 GB of the Python layer on a loaded 2-core machine), which
    # `finish_builds` waits for at the end of the run.
    failed = []
    pending = dict(builds)
    while pending:
        for name, proc in list(pending.items()):
            log = (log_dir / f"build-{name}.log").read_text()
            if proc.poll() is not None or f"Successfully tagged {tags[name]}" in log:
                build_s[name] = round(time.monotonic() - t1, 1)
                if proc.poll() is not None and proc.returncode != 0:
                    failed.append(name)
                del pending[name]
        time.sleep(0.2)
    if failed:
        finish_builds(list(builds.values()))
        tails = "\n".join(
            f"--- {name}:\n{(log_dir / f'build-{name}.log').read_text()[-2000:]}" for name in failed
        )
        raise RuntimeError(f"podman build of {', '.join(failed)} failed:\n{tails}")
    return ClusterImages(tags["gyre"], tags["nats"], tags["redis"], build_s, list(builds.values()))


def finish_builds(builds: list[subprocess.Popen[str]], timeout_s: float = 600) -> None:
    """Wait for the build processes (their clean-up after the image was tagged)."""
    for proc in builds:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait(timeout=30)


def untag_images(images: ClusterImages) -> None:
    """Remove the run's names of its images once their builds have ended; the images stay as the layer
    cache of the next build."""
    finish_builds(images.builds)
    for tag in (images.gyre, images.nats, images.redis):
        subprocess.run(["podman", "untag", tag, tag], env=podman_env(), capture_output=True)
