"""The fork server keeps the sandbox: a `python -m` command forked from it sees exactly what the same
command started as a new interpreter sees (uid, groups, environment, cwd, rlimits, descriptors, process
group, network, argv), under every launcher this machine supports; it ends, stops and is swept the
same way; what the server cannot take starts the plain way."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gyre import procs
from gyre.sandbox import NetworkPolicy, SandboxLimits, SandboxSpec
from gyre.sandbox.forkclient import ForkedProcess, ForkServer
from tests.support.eventually import eventually
from tests.support.sandboxes import launcher_for_test

SUPPORTED = ["process", "isolated"] if os.geteuid() == 0 else ["process"]
UID_BASE = 176000

PROBE = """
import json, os, resource, signal, socket, sys, time

def network():
    try:
        socket.create_connection(("1.1.1.1", 80), 1)
        return "reachable"
    except OSError as e:
        return f"unreachable {e.errno}"

def main():
    if sys.argv[1:2] == ["hang"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open("ready", "w").close()
        time.sleep(600)  # scenario: it hangs until killed
    limits = ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")
    print(json.dumps({
        "uid": [os.getuid(), os.geteuid(), os.getgid()], "groups": os.getgroups(), "env": dict(os.environ),
        "cwd": os.getcwd(), "argv": sys.argv[1:], "argv0": os.path.basename(sys.argv[0]), "name": __name__,
        "path0": sys.path[0], "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in limits},
        "fds": sorted(os.listdir("/proc/self/fd")), "stdio": [os.readlink(f"/proc/self/fd/{i}") for i in range(3)],
        "own_group": os.getpgid(0) == os.getpid(), "session_leader": os.getsid(0) == os.getpid(),
        "network": network(),
    }))
    sys.exit(int(sys.argv[1]))

if __name__ == "__main__":
    main()
"""


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    package = tmp_path / "lib" / "gyreprobe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(PROBE)
    return package.parent


@pytest.fixture
async def server(probe: Path, tmp_path: Path) -> AsyncIterator[ForkServer]:
    s = ForkServer.start("gyreprobe", paths=(str(probe),), log_path=tmp_path / "forkserver.log")
    assert await s.ready(), s.error
    yield s
    await s.stop()


def spec(tmp_path: Path, probe: Path, name: str, *args: str, argv: list[str] | None = None) -> SandboxSpec:
    workspace = tmp_path / f"ws-{name}"
    workspace.mkdir()
    return SandboxSpec(
        name=name,
        argv=argv or [sys.executable, "-m", "gyreprobe", *args],
        cwd=workspace,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(probe), "ONLY": "1"},
        root=tmp_path / f"box-{name}",
        limits=SandboxLimits(cpu_s=77, file_size_mb=5),
        network=NetworkPolicy("none"),
        reveal=(probe,),
        writable=(workspace,),
    )


def normalized(report: dict[str, Any], name: str, uid: int | None) -> dict[str, Any]:
    """The probe's report with what differs by design between two sandboxes (paths, slot uid) named."""
    out = dict(json.loads(json.dumps(report).replace(f"ws-{name}", "ws-X").replace(f"box-{name}", "box-X")))
    out["uid"] = ["UID" if uid is not None and x == uid else x for x in out["uid"]]
    return out


@pytest.mark.parametrize("name", SUPPORTED)
async def test_a_forked_start_sees_exactly_what_a_plain_start_sees(
    name: str, server: ForkServer, probe: Path, tmp_path: Path
) -> None:
    launcher = launcher_for_test(name, UID_BASE, 2)
    reports = {}
    for mode in ("plain", "forked"):
        launcher.fork_server = server if mode == "forked" else None
        handle = await launcher.launch(spec(tmp_path, probe, mode, "7"))
        outcome = await handle.wait()
        await handle.release()
        assert (outcome.started, outcome.exit_code, outcome.signal) == (True, 7, None), outcome
        assert isinstance(handle._process, ForkedProcess) == (mode == "forked")
        report = json.loads((handle.control_dir / "stdout.log").read_text())
        reports[mode] = normalized(report, mode, handle.state.uid)
    assert reports["forked"] == reports["plain"]
    plain = reports["plain"]
    assert plain["name"] == "__main__" and plain["argv"] == ["7"] and plain["argv0"] == "__main__.py"
    assert plain["fds"] == ["0", "1", "2", "3"]  # stdio and listdir's own descriptor: nothing inherited
    assert plain["rlimits"]["RLIMIT_CPU"] == [77, 77] and plain["own_group"] and not plain["session_leader"]
    assert set(plain["env"]) <= {"PATH", "PYTHONPATH", "ONLY", "HOME", "TMPDIR", "LC_CTYPE"}
    if name == "isolated":
        assert (
            plain["uid"] == ["UID"] * 3
            and plain["groups"] == []
            and plain["network"].startswith("unreachable")
        )


@pytest.mark.parametrize("name", SUPPORTED)
async def test_a_forked_sandbox_is_stopped_and_swept_like_any_other(
    name: str, server: ForkServer, probe: Path, tmp_path: Path
) -> None:
    launcher = launcher_for_test(name, UID_BASE, 2)
    launcher.fork_server = server
    box = spec(tmp_path, probe, "hang", "hang")
    handle = await launcher.launch(box)
    assert isinstance(handle._process, ForkedProcess)
    await eventually((box.cwd / "ready").exists, what="the forked command to start")
    assert handle.running()
    outcome = await handle.stop(grace_s=0.3)  # SIGTERM is ignored: SIGKILL after the grace
    await handle.release()
    assert (outcome.started, outcome.signal) == (True, signal.SIGKILL)
    assert not handle.running() and handle._process.returncode is not None
    if handle.state.uid is not None:
        assert procs.pids_of_uid(handle.state.uid) == []


async def test_a_sandbox_outlives_its_fork_server_and_is_then_polled(probe: Path, tmp_path: Path) -> None:
    server = ForkServer.start("gyreprobe", paths=(str(probe),), log_path=tmp_path / "forkserver.log")
    launcher = launcher_for_test(SUPPORTED[-1], UID_BASE, 2)
    launcher.fork_server = server
    box = spec(tmp_path, probe, "orphan", "hang")
    handle = await launcher.launch(box)
    await eventually((box.cwd / "ready").exists, what="the forked command to start")
    await server.stop()
    assert not server.alive and handle.running()
    outcome = await handle.stop(grace_s=0.3)
    await handle.release()
    assert outcome.signal == signal.SIGKILL and not handle.running()


async def test_what_the_server_cannot_take_starts_as_a_new_interpreter(
    server: ForkServer, probe: Path, tmp_path: Path
) -> None:
    launcher = launcher_for_test("process", UID_BASE, 2)
    launcher.fork_server = server
    other = spec(tmp_path, probe, "bash", argv=["bash", "-c", "exit 4"])
    handle = await launcher.launch(other)
    assert (await handle.wait()).exit_code == 4 and not isinstance(handle._process, ForkedProcess)
    await handle.release()

    # A server whose preload failed takes nothing: the same command then starts (and fails) plainly.
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = ForkServer.start("gyreprobe", paths=(str(empty),), log_path=tmp_path / "broken.log")
    assert not await broken.ready() and "No module named 'gyreprobe'" in broken.error
    launcher.fork_server = broken
    missing = spec(tmp_path, probe, "fallback", "3")
    missing.env["PYTHONPATH"] = str(empty)
    handle = await launcher.launch(missing)
    outcome = await handle.wait()
    await handle.release()
    await broken.stop()
    assert outcome.exit_code == 1 and "No module named gyreprobe" in outcome.stderr_tail
    assert not isinstance(handle._process, ForkedProcess)
