"""Task images through the real engine: a multi-stage Dockerfile (FROM, RUN, ENV, WORKDIR, COPY, COPY
--from, ADD) is built as the engine builds it and tagged by the environment's digest; `[environment]
docker_image` is used as given (one line when it is not on the host); the harness runs as the image's
USER, owning its workspace and HOME; a container has no capability, no new privileges, and the task's
cpus, memory and the pids limit on its cgroup."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from gyre.config.runner import LOCAL_BASE_IMAGE
from gyre.sandbox import SandboxLimits, SandboxSpec
from gyre.sandbox.containers.images import ImageError
from gyre.sandbox.launchers.base import LABEL_EXECUTION
from gyre.sandbox.launchers.container import ContainerLauncher
from gyre.tasks import Problems, Task
from gyre.tasks.harbor import load_harbor_task
from tests.support.containers import engine_client
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
