"""The contract of every registered sandbox launcher (`LAUNCHERS`): a launcher this machine cannot run
(`isolated` needs root) fails under CI and is skipped with the reason elsewhere."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from gyre import procs
from gyre.config import GyreConfig
from gyre.sandbox import (
    LAUNCHERS,
    NetworkPolicy,
    SandboxLauncher,
    SandboxLimits,
    SandboxSpec,
    check_disjoint,
    make_launcher,
    uid_range,
)
from tests.support.sandboxes import launcher_for_test

SUPPORTED = list(LAUNCHERS)
UID_BASE = 150000


def launcher(name: str) -> SandboxLauncher:
    return launcher_for_test(name, UID_BASE, 2)


def spec(tmp_path: Path, script: str, **kw: object) -> SandboxSpec:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    return SandboxSpec(
        name="t",
        argv=["bash", "-c", script],
        cwd=workspace,
        env={"PATH": "/usr/bin:/bin", "ONLY": "1"},
        root=tmp_path / "box",
        writable=(workspace,),
        **kw,
    )  # type: ignore[arg-type]


def test_the_config_accepts_exactly_the_registered_launchers() -> None:
    for name in ["auto", *LAUNCHERS]:
        assert GyreConfig.model_validate({"runner": {"sandbox": {"isolation": name}}})
    with pytest.raises(ValueError, match="'docker' is not a sandbox launcher; choose one of auto, process"):
        GyreConfig.model_validate({"runner": {"sandbox": {"isolation": "docker"}}})
    with pytest.raises(ValueError, match="unknown sandbox isolation"):
        make_launcher("docker")


@pytest.mark.parametrize("name", SUPPORTED)
async def test_runs_in_the_workspace_with_exactly_the_given_environment(name: str, tmp_path: Path) -> None:
    os.environ["GYRE_SECRET_OF_THE_RUNNER"] = "leak"
    try:
        sandbox = launcher(name)
        handle = await sandbox.launch(spec(tmp_path, "env | sort > env.txt; pwd; echo oops >&2; exit 7"))
        outcome = await handle.wait()
        await handle.release()
    finally:
        del os.environ["GYRE_SECRET_OF_THE_RUNNER"]
    assert (outcome.started, outcome.exit_code, outcome.signal) == (True, 7, None)
    assert outcome.describe() == "exit 7: oops"
    assert (handle.control_dir / "stdout.log").read_text().strip() == str(tmp_path / "ws")
    names = {line.split("=", 1)[0] for line in (tmp_path / "ws" / "env.txt").read_text().splitlines()}
    assert {"ONLY", "PATH", "HOME", "TMPDIR"} <= names and "GYRE_SECRET_OF_THE_RUNNER" not in names
    assert names <= {"ONLY", "PATH", "HOME", "TMPDIR", "PWD", "SHLVL", "_", "OLDPWD"}


@pytest.mark.parametrize("name", SUPPORTED)
async def test_stop_kills_a_command_that_ignores_sigterm(name: str, tmp_path: Path) -> None:
    handle = await launcher(name).launch(spec(tmp_path, "trap '' TERM; touch ready; sleep 600"))
    while not (tmp_path / "ws" / "ready").exists():
        await asyncio.sleep(0.02)
    outcome = await handle.stop(grace_s=0.3)
    await handle.release()
    assert (outcome.started, outcome.signal) == (True, signal.SIGKILL)
    assert not handle.running()


@pytest.mark.parametrize("name", SUPPORTED)
async def test_a_command_that_cannot_start_is_reported_as_never_started(name: str, tmp_path: Path) -> None:
    broken = SandboxSpec(name="t", argv=["/no/such/binary"], cwd=tmp_path, env={}, root=tmp_path / "box")
    handle = await launcher(name).launch(broken)
    outcome = await handle.wait()
    await handle.release()
    assert not outcome.started and "No such file" in outcome.error
    assert outcome.describe().startswith("sandbox never started")


@pytest.mark.parametrize("name", SUPPORTED)
async def test_rlimits_apply(name: str, tmp_path: Path) -> None:
    limited = spec(tmp_path, "head -c 3000000 /dev/zero > big", limits=SandboxLimits(file_size_mb=1))
    handle = await launcher(name).launch(limited)
    outcome = await handle.wait()
    await handle.release()
    assert outcome.exit_code != 0 and (tmp_path / "ws" / "big").stat().st_size <= 1024 * 1024


@pytest.mark.parametrize("name", SUPPORTED)
async def test_a_restarted_owner_can_attach_and_wait(name: str, tmp_path: Path) -> None:
    handle = await launcher(name).launch(spec(tmp_path, "sleep 0.5; exit 3"))
    adopted = launcher(name).attach(handle.state)
    outcome = await adopted.wait(poll_s=0.05)
    await handle.wait()
    await handle.release()
    assert outcome.exit_code == 3 and not adopted.running()


async def test_isolated_sandbox_has_its_own_uid_no_network_and_is_swept(tmp_path: Path) -> None:
    sandbox = launcher("isolated")
    assert sandbox.uses_uids
    script = (
        f"id -u > uid.txt; {sys.executable} -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 2)' "
        "2> net.txt; setsid sleep 600 & exit 0"
    )
    handle = await sandbox.launch(spec(tmp_path, script, network=NetworkPolicy("none")))
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
