"""Task images through the real engine: a multi-stage Dockerfile (FROM, RUN, ENV, WORKDIR, COPY, COPY
--from, ADD) is built as the engine builds it and tagged by the digest of the environment and of the
images it builds from (a rebuilt base, a new tag); a build's RUN steps have no network but loopback
unless the task allows the internet, and the task's memory and cpus; a build past its timeout is killed
on the engine, not only abandoned; `[environment] docker_image` is used as given (one line when it is not
on the host); the harness runs as the image's USER, owning its workspace and HOME; a container has no
capability, no new privileges, and the task's cpus, memory and the pids limit on its cgroup."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gyre.config.runner import LOCAL_BASE_IMAGE, SandboxSection
from gyre.sandbox import SandboxLimits, SandboxSpec
from gyre.sandbox.containers.images import ImageError, Images
from gyre.sandbox.launchers.base import LABEL_EXECUTION
from gyre.sandbox.launchers.container import ContainerLauncher
from gyre.tasks import Problems, Task
from gyre.tasks.harbor import load_harbor_task
from tests.support.containers import engine_client
from tests.support.eventually import eventually
from tests.support.sandboxes import launcher_for_test

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("container_session")]


def _task(root: Path, dockerfile: str | None, files: dict[str, str], toml: str = "") -> Task:
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "instruction.md").write_text("Do it.\n")
    (root / "task.toml").write_text('version = "1.0"\n' + toml)
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    if dockerfile is not None:
        (root / "environment" / "Dockerfile").write_text(dockerfile)
    for name, content in files.items():
        (root / "environment" / name).write_text(content)
    problems = Problems()
    task = load_harbor_task(root, f"t/{root.name}", problems)
    assert task is not None, problems.errors
    return task


async def _run(
    launcher: ContainerLauncher, task: Task, script: str, tmp_path: Path
) -> tuple[str, Path, dict[str, Any]]:
    """`script` in a container of the task's image, in its working directory; its stdout, a copy of
    that directory and the engine's HostConfig of the container."""
    image = await launcher.environment(task)
    workdir = task.environment.workdir or "/app"
    spec = SandboxSpec(
        name=f"img-{uuid.uuid4().hex[:8]}",
        argv=["bash", "-c", script],
        cwd=Path(workdir),
        env={},
        root=tmp_path / "box",
        image=image.reference,
        labels={LABEL_EXECUTION: uuid.uuid4().hex[:8]},
        resources=task.environment.resources(),
        limits=SandboxLimits(max_processes=64),
    )
    handle = await launcher.launch(spec)
    try:
        outcome = await handle.wait()
        assert outcome.exit_code == 0, outcome
        out = tmp_path / "out"
        assert await handle.copy_out(workdir, out)
        container = handle.container()
        assert container is not None
        container.reload()
        return handle.stdout(), out, container.attrs["HostConfig"]
    finally:
        await handle.release()
        await handle.remove()


async def test_a_multi_stage_dockerfile_is_built_by_the_engine(tmp_path: Path) -> None:
    engine_client()
    dockerfile = f"""FROM {LOCAL_BASE_IMAGE} AS build
RUN echo built-in-stage-one > /built.txt
FROM {LOCAL_BASE_IMAGE}
ENV GREETING=hello-from-env
WORKDIR /srv/task
COPY --from=build /built.txt /opt/built.txt
ADD added.txt ./
COPY run.sh ./
RUN chmod +x run.sh
"""
    task = _task(tmp_path / "multi", dockerfile, {"added.txt": "added\n", "run.sh": "echo ran\n"})
    launcher = launcher_for_test("container", 0, 1)
    assert isinstance(launcher, ContainerLauncher)
    first = await launcher.images.build(task)
    assert not first.cached and first.log is None and first.image.startswith("localhost/gyre/env:")
    again = await launcher.images.build(task)
    assert again.cached and again.image == first.image  # one build per host for an unchanged task
    stdout, workdir, _ = await _run(
        launcher, task, "cat /opt/built.txt; echo $GREETING; ./run.sh; pwd", tmp_path
    )
    assert stdout.split() == ["built-in-stage-one", "hello-from-env", "ran", "/srv/task"]
    assert (workdir / "added.txt").read_text() == "added\n"
    launcher.images.remove(first.image)
    await launcher.close()


async def test_a_given_docker_image_is_used_as_it_is(tmp_path: Path) -> None:
    engine_client()
    launcher = launcher_for_test("container", 0, 1)
    assert isinstance(launcher, ContainerLauncher)
    given = _task(tmp_path / "given", None, {}, f'[environment]\ndocker_image = "{LOCAL_BASE_IMAGE}"\n')
    result = await launcher.images.build(given)
    assert (result.image, result.cached) == (LOCAL_BASE_IMAGE, True)
    missing = _task(tmp_path / "missing", None, {}, '[environment]\ndocker_image = "localhost/gyre/none:1"\n')
    with pytest.raises(ImageError) as e:
        await launcher.images.ensure(missing)
    assert str(e.value) == (
        "task t/missing: image localhost/gyre/none:1 is not on this host (and no Dockerfile builds it)"
    )
    await launcher.close()


async def test_the_harness_runs_as_the_images_user_without_privileges_under_its_limits(
    tmp_path: Path,
) -> None:
    client = engine_client()
    dockerfile = f"""FROM {LOCAL_BASE_IMAGE}
RUN useradd --create-home --uid 1234 agent && mkdir /home/agent/app && chown agent /home/agent/app
USER agent
WORKDIR /home/agent/app
COPY --chown=agent notes.txt ./
"""
    toml = "[environment]\ncpus = 1\nmemory_mb = 256\n"
    task = _task(tmp_path / "user", dockerfile, {"notes.txt": "notes\n"}, toml)
    launcher = launcher_for_test("container", 0, 1)
    assert isinstance(launcher, ContainerLauncher)
    script = (
        "id -u; echo $HOME; touch made.txt ~/in-home.txt && echo wrote; "
        "grep -E '^(CapEff|NoNewPrivs):' /proc/self/status | tr -s '\\t ' ' '"
    )
    stdout, workdir, host = await _run(launcher, task, script, tmp_path)
    lines = stdout.strip().split("\n")
    assert lines == ["1234", "/.gyre/home", "wrote", "CapEff: 0000000000000000", "NoNewPrivs: 1"], lines
    assert (workdir / "made.txt").exists() and (workdir / "notes.txt").read_text() == "notes\n"
    # The limits as the engine applied them: the task's cpus and memory_mb, the pids limit, no swap.
    assert (host["NanoCpus"], host["Memory"], host["MemorySwap"]) == (10**9, 256 << 20, 256 << 20)
    assert host["PidsLimit"] == 64 and host["Privileged"] is False
    assert (
        client.containers.list(all=True, filters={"label": f"gyre.run={launcher.labels['gyre.run']}"}) == []
    )
    await launcher.close()


def _output(log: Path, *keys: str) -> dict[str, str]:
    """The lines `key: value` a build's RUN step printed, from its log."""
    found = {}
    for line in log.read_text().splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in keys:
            found[key] = value.strip()
    return found


async def test_a_build_has_no_network_unless_the_task_allows_it_and_the_tasks_limits(tmp_path: Path) -> None:
    engine_client()
    sandbox = SandboxSection()
    images = Images.of_engine(sandbox, tmp_path / "builds")
    probe = (
        "echo \"net: $(ls /sys/class/net | tr '\\n' ' ')\"; "
        'echo "memory: $(cat /sys/fs/cgroup/memory.max 2>/dev/null '
        '|| cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"; '
        'echo "cpu: $(cat /sys/fs/cgroup/cpu.max 2>/dev/null '
        '|| echo $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us))"'
    )
    offline = _task(
        tmp_path / "offline",
        f"FROM {LOCAL_BASE_IMAGE}\nRUN echo {uuid.uuid4().hex} >/dev/null; {probe}\n",
        {},
        "[environment]\ncpus = 2\nmemory_mb = 300\n",
    )
    online = _task(
        tmp_path / "online",
        f"FROM {LOCAL_BASE_IMAGE}\nRUN echo {uuid.uuid4().hex} >/dev/null; {probe}\n",
        {},
        "[environment]\nallow_internet = true\n",
    )
    built = [await images.build(offline), await images.build(online)]
    try:
        assert [b.cached for b in built] == [False, False]
        assert built[0].log is not None and built[1].log is not None
        # Offline (the default): a namespace of its own with loopback only; the task's memory, no swap
        # beyond it (the cgroup's limit), and its cpus as a CFS quota.
        assert _output(built[0].log, "net", "memory", "cpu") == {
            "net": "lo",
            "memory": str(300 << 20),
            "cpu": "200000 100000",
        }
        # Allowed: its own namespace on the engine's default network (not the host's interfaces); the
        # sandbox's default memory and cpus.
        seen = _output(built[1].log, "net", "memory", "cpu")
        assert "lo" in seen["net"].split() and len(seen["net"].split()) >= 2, seen
        assert set(seen["net"].split()) != set(os.listdir("/sys/class/net")), seen
        assert seen["memory"] == str((sandbox.memory_mb or 0) << 20)
        cpus = sandbox.container.cpus
        assert seen["cpu"] == (f"{round(cpus * 100_000)} 100000" if cpus else seen["cpu"])
    finally:
        for b in built:
            images.remove(b.image)


def _processes(marker: str) -> list[int]:
    """This host's processes whose command line holds `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


async def test_a_build_past_its_timeout_is_killed_on_the_engine(tmp_path: Path) -> None:
    client = engine_client()
    marker = f"600.{uuid.uuid4().int % 10**9:09d}"  # `sleep 600.<n>`: its own command line on this host
    slow = _task(
        tmp_path / "slow",
        f"FROM {LOCAL_BASE_IMAGE}\nRUN echo started && sleep {marker}\nRUN touch /never\n",
        {},
        "[environment]\nbuild_timeout_sec = 4\n",
    )
    images = Images.of_engine(SandboxSection(), tmp_path / "builds")
    building = asyncio.create_task(images.build(slow))
    await eventually(lambda: _processes(marker), timeout_s=50, what="the build's RUN sleep to start")
    with pytest.raises(ImageError) as e:
        await building
    image = await images.reference(slow)
    log = tmp_path / "builds" / f"t_slow-{image.rsplit(':', 1)[-1][:12]}.log"
    assert str(e.value) == f"task t/slow: image build ran past its 4 s timeout; log: {log}"
    # Killed on the engine, not only abandoned: by the time the execution fails no step of it runs,
    # the build ended there (no image), and the log says what was done.
    assert _processes(marker) == []
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(image)
    assert "STEP 3/3" not in log.read_text()
    assert log.read_text().splitlines()[-1].startswith("gyre: past the 4 s timeout: ")
    # The failure is remembered: the task's next execution fails at once with the same line.
    with pytest.raises(ImageError) as again:
        await asyncio.wait_for(images.ensure(slow), 10)
    assert str(again.value) == str(e.value)


async def test_a_rebuilt_base_gives_the_task_a_new_tag(tmp_path: Path) -> None:
    client = engine_client()
    base = f"localhost/gyre/test-base:{uuid.uuid4().hex[:12]}"
    (tmp_path / "base").mkdir()

    def build_base(marker: str) -> str:
        (tmp_path / "base" / "Dockerfile").write_text(f"FROM {LOCAL_BASE_IMAGE}\nCOPY marker.txt /\n")
        (tmp_path / "base" / "marker.txt").write_text(marker + "\n")
        image, _ = client.images.build(path=str(tmp_path / "base"), tag=base, rm=True)
        return str(image.id)

    # The base is a stage's, not the final FROM: every image the Dockerfile builds from counts.
    dockerfile = f"FROM {base} AS stage\nFROM {LOCAL_BASE_IMAGE}\nCOPY --from=stage /marker.txt /opt/\n"
    task = _task(tmp_path / "based", dockerfile, {})
    launcher = launcher_for_test("container", 0, 1)
    assert isinstance(launcher, ContainerLauncher)
    built: list[str] = []
    try:
        first_base = build_base("one")
        first = await launcher.images.build(task)
        built.append(first.image)
        assert (await launcher.images.build(task)).cached
        second_base = build_base("two")
        assert second_base != first_base
        second = await launcher.images.build(task)
        built.append(second.image)
        assert not second.cached and second.image != first.image
        stdout, _, _ = await _run(launcher, task, "cat /opt/marker.txt", tmp_path)
        assert stdout.split() == ["two"]
    finally:
        for image in built:
            launcher.images.remove(image)
        client.images.remove(base, force=True)
        await launcher.close()
