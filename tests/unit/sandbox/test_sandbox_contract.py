"""The contract of every registered sandbox launcher (`LAUNCHERS`): a launcher this machine cannot run
(`isolated` and `container` need root, `container` an engine) fails under CI and is skipped with the
reason elsewhere. A launcher with its own filesystem gets the workspace copied in at /work and its
results copied out; the environment operations (exec, copies, find, reap) are its own part."""

from __future__ import annotations

import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gyre import procs
from gyre.config import GyreConfig
from gyre.config.runner import LAUNCHER_NAMES
from gyre.sandbox import (
    LAUNCHERS,
    NetworkPolicy,
    SandboxHandle,
    SandboxLauncher,
    SandboxLimits,
    SandboxSpec,
    check_disjoint,
    make_launcher,
    uid_range,
)
from gyre.sandbox.launchers.base import LABEL_EXECUTION
from tests.support.eventually import eventually
from tests.support.sandboxes import launcher_for_test

UID_BASE = 150000
INSIDE = "/work"
#: What a container engine adds to an exec's environment (podman: TERM, container; docker: HOSTNAME).
ENGINE_ENV = {"TERM", "container", "HOSTNAME"}


@pytest.fixture(params=list(LAUNCHERS))
async def launcher(request: pytest.FixtureRequest) -> AsyncIterator[SandboxLauncher]:
    if launcher_class_own_filesystem(request.param):
        request.getfixturevalue("container_session")
    sandbox = launcher_for_test(request.param, UID_BASE, 2)
    yield sandbox
    await sandbox.reap({})
    await sandbox.close()


def launcher_class_own_filesystem(name: str) -> bool:
    from gyre.sandbox import launcher_class

    return launcher_class(name).own_filesystem


def spec(launcher: SandboxLauncher, tmp_path: Path, script: str, **kw: object) -> SandboxSpec:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    inside = launcher.own_filesystem
    return SandboxSpec(
        name=f"t-{uuid.uuid4().hex[:8]}",
        argv=["bash", "-c", script],
        cwd=Path(INSIDE) if inside else workspace,
        env={"PATH": "/usr/bin:/bin", "ONLY": "1"},
        root=tmp_path / "box",
        writable=(workspace,),
        copy_in=((workspace, INSIDE),) if inside else (),
        labels={LABEL_EXECUTION: f"e-{uuid.uuid4().hex[:8]}"},
        **kw,
    )  # type: ignore[arg-type]


async def results(handle: SandboxHandle, tmp_path: Path) -> Path:
    """The command's working directory as the host sees it after the command."""
    if not handle.launcher.own_filesystem:
        return tmp_path / "ws"
    out = tmp_path / "out"
    assert await handle.copy_out(INSIDE, out)
    return out


def test_the_config_accepts_exactly_the_registered_launchers() -> None:
    # The config keeps the names below the sandbox (LAUNCHER_NAMES): they are the registry's, in its order.
    assert tuple(LAUNCHERS) == LAUNCHER_NAMES
    for name in ["auto", *LAUNCHERS]:
        box = {"sandbox": {"isolation": name}}
        assert GyreConfig.model_validate({"runner": box, "evaluator": box})
    with pytest.raises(ValueError, match="'docker' is not a sandbox launcher; choose one of auto, process"):
        GyreConfig.model_validate({"runner": {"sandbox": {"isolation": "docker"}}})
    with pytest.raises(ValueError, match="unknown sandbox isolation"):
        make_launcher("docker")


async def test_runs_in_the_workspace_with_exactly_the_given_environment(
    launcher: SandboxLauncher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_SECRET_OF_THE_RUNNER", "leak")
    handle = await launcher.launch(
        spec(launcher, tmp_path, "env | sort > env.txt; pwd; echo oops >&2; exit 7")
    )
    outcome = await handle.wait()
    await handle.release()
    assert (outcome.started, outcome.exit_code, outcome.signal) == (True, 7, None)
    assert outcome.describe() == "exit 7: oops"
    cwd = INSIDE if launcher.own_filesystem else str(tmp_path / "ws")
    assert handle.stdout().strip() == cwd
    names = {
        line.split("=", 1)[0]
        for line in (await results(handle, tmp_path) / "env.txt").read_text().splitlines()
    }
    assert {"ONLY", "PATH", "HOME", "TMPDIR"} <= names and "GYRE_SECRET_OF_THE_RUNNER" not in names
    engine = ENGINE_ENV if launcher.own_filesystem else set()
    assert names <= {"ONLY", "PATH", "HOME", "TMPDIR", "PWD", "SHLVL", "_", "OLDPWD", *engine}


async def test_stop_kills_a_command_that_ignores_sigterm(launcher: SandboxLauncher, tmp_path: Path) -> None:
    handle = await launcher.launch(spec(launcher, tmp_path, "trap '' TERM; echo ready; sleep 600"))
    await eventually(lambda: "ready" in handle.stdout(), what="the command to trap SIGTERM")
    outcome = await handle.stop(grace_s=0.3)
    await handle.release()
    assert (outcome.started, outcome.signal) == (True, signal.SIGKILL)
    assert not handle.running()


async def test_a_command_that_cannot_start_is_reported_as_never_started(
    launcher: SandboxLauncher, tmp_path: Path
) -> None:
    broken = spec(launcher, tmp_path, "")
    handle = await launcher.launch(SandboxSpec(**{**_fields(broken), "argv": ["/no/such/binary"]}))
    outcome = await handle.wait()
    await handle.release()
    assert not outcome.started and ("No such file" in outcome.error or "not found" in outcome.error), outcome
    assert outcome.describe().startswith("sandbox never started")


def _fields(s: SandboxSpec) -> dict[str, object]:
    return {name: getattr(s, name) for name in SandboxSpec.__dataclass_fields__}


async def test_rlimits_apply(launcher: SandboxLauncher, tmp_path: Path) -> None:
    limited = spec(
        launcher, tmp_path, "head -c 3000000 /dev/zero > big", limits=SandboxLimits(file_size_mb=1)
    )
    handle = await launcher.launch(limited)
    outcome = await handle.wait()
    await handle.release()
    assert outcome.exit_code != 0 and (await results(handle, tmp_path) / "big").stat().st_size <= 1024 * 1024


async def test_a_restarted_owner_can_attach_and_wait(launcher: SandboxLauncher, tmp_path: Path) -> None:
    handle = await launcher.launch(spec(launcher, tmp_path, "sleep 0.5; exit 3"))
    adopted = launcher_for_test(launcher.name, UID_BASE, 2).attach(handle.state)
    outcome = await adopted.wait(poll_s=0.05)
    await handle.wait()
    await handle.release()
    assert outcome.exit_code == 3 and not adopted.running()


@pytest.mark.parametrize("name", [n for n in LAUNCHERS if launcher_class_own_filesystem(n)])
async def test_a_kept_sandbox_runs_more_commands_copies_and_is_found_and_reaped(
    name: str, tmp_path: Path, container_session: None
) -> None:
    launcher = launcher_for_test(name, UID_BASE, 2)
    box = spec(launcher, tmp_path, "echo state > kept.txt; sleep 600 & exit 0")
    (tmp_path / "ws" / "given.txt").write_text("given\n")
    handle = await launcher.launch(box)
    assert (await handle.wait()).exit_code == 0
    assert await handle.release() == []  # the background sleep was swept; the container stays
    found = await launcher.find(box.labels)
    assert found is not None and found.state.container == handle.state.container
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "t.sh").write_text("cat /work/kept.txt /work/given.txt; echo $SEEN; sleep 600\n")
    await found.copy_in([(extra, "/tests")], replace=True)
    result = await found.exec("check", ["bash", "/tests/t.sh"], INSIDE, {"SEEN": "yes"}, 1.0, 0.2)
    assert result.timed_out and result.stdout.split() == ["state", "given", "yes"]
    assert result.outcome.signal == signal.SIGTERM
    assert not await found.copy_out("/nowhere", tmp_path / "none")
    assert await launcher.reap(box.labels) == 1
    assert await launcher.find(box.labels) is None
    await launcher.close()


async def test_isolated_sandbox_has_its_own_uid_no_network_and_is_swept(tmp_path: Path) -> None:
    sandbox = launcher_for_test("isolated", UID_BASE, 2)
    assert sandbox.uses_uids
    script = (
        f"id -u > uid.txt; {sys.executable} -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 2)' "
        "2> net.txt; setsid sleep 600 & exit 0"
    )
    handle = await sandbox.launch(spec(sandbox, tmp_path, script, network=NetworkPolicy("none")))
    outcome = await handle.wait()
    uid = handle.state.uid
    assert uid is not None and procs.pids_of_uid(uid)  # the detached sleep outlived the command
    assert await handle.release() == []
    assert procs.pids_of_uid(uid) == []
    assert outcome.exit_code == 0 and (tmp_path / "ws" / "uid.txt").read_text().strip() == str(uid)
    assert "unreachable" in (tmp_path / "ws" / "net.txt").read_text()


def test_uid_ranges_of_services_must_not_overlap() -> None:
    check_disjoint(runner=uid_range(120000, 0, 32), evaluator=uid_range(130000, 0, 4))
    assert uid_range(120000, 2, 3) == range(122000, 122003)
    with pytest.raises(ValueError, match="overlap"):
        check_disjoint(runner=uid_range(120000, 0, 2000), evaluator=uid_range(121000, 0, 4))
