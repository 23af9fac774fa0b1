"""The parts of the container launcher that need no engine: the environment digest that tags a task's
image, the tar archives put into containers, files and directories read out of a container without
following a symlink, the endpoint and label settings, and the failing step named from an engine's
build output (podman's and dockerd's)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from gyre.sandbox.containers import archive, engine, images, processes
from gyre.sandbox.workspace import content_hash


def _env(tmp_path: Path) -> Path:
    env = tmp_path / "environment"
    env.mkdir()
    (env / "Dockerfile").write_text("FROM localhost/gyre/debian-base:bookworm\nRUN true\n")
    (env / "run.sh").write_text("echo hi\n")
    return env


def test_the_environment_digest_follows_content_and_modes_not_times(tmp_path: Path) -> None:
    env = _env(tmp_path)
    first = images.environment_digest(env)
    os.utime(env / "run.sh", (1, 1))
    assert images.environment_digest(env) == first
    (env / "run.sh").chmod(0o755)
    executable = images.environment_digest(env)
    assert executable != first
    (env / "run.sh").write_text("echo ho\n")
    assert images.environment_digest(env) not in (first, executable)
    (env / "link").symlink_to("run.sh")
    assert images.image_tag(env).startswith("localhost/gyre/env:") and len(images.image_tag(env)) == 19 + 24


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("[2/2] STEP 6/7: RUN make test", "STEP 6/7: RUN make test"),
        ("STEP 1/2: FROM nowhere.invalid/x:1", "STEP 1/2: FROM nowhere.invalid/x:1"),
        ("Step 3/5 : RUN false", "Step 3/5 : RUN false"),
        ("--> 2ca1ca24391", None),
    ],
)
def test_the_failing_step_is_found_in_podmans_and_dockers_output(line: str, step: str | None) -> None:
    found = images._STEP.match(line)
    assert (found.group(1) if found else None) == step


def test_an_archive_carries_files_modes_symlinks_and_its_owner(tmp_path: Path) -> None:
    source = tmp_path / "ws"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_text("a\n")
    (source / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (source / "sub" / "run.sh").chmod(0o755)
    (source / "py").symlink_to("/usr/bin/python3")
    data = archive.pack(
        [archive.TreeEntry(source, "app"), archive.DirEntry(".gyre/control"), archive.FileEntry("h/x", b"1")],
        uid=1000,
        gid=1000,
    )
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    expected = {
        "app",
        "app/a.txt",
        "app/sub",
        "app/sub/run.sh",
        "app/py",
        ".gyre",
        ".gyre/control",
        "h",
        "h/x",
    }
    assert set(members) == expected
    assert all((m.uid, m.gid) == (1000, 1000) for m in members.values())
    assert members["app/sub/run.sh"].mode & 0o111 and members["app/py"].linkname == "/usr/bin/python3"


def test_a_directory_is_copied_out_as_it_is_without_following_a_symlink(tmp_path: Path) -> None:
    """/proc/<pid>/root of this process is the host root: the same walk a container's directory gets."""
    inside = tmp_path / "app"
    (inside / "sub").mkdir(parents=True)
    (inside / "a.txt").write_text("a\n")
    (inside / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (inside / "sub" / "run.sh").chmod(0o4755)
    (inside / "etc").symlink_to("/etc")  # a link out of the tree stays a link
    os.mkfifo(inside / "fifo")
    out = tmp_path / "out"
    assert processes.copy_out(os.getpid(), str(inside), out)
    assert not (out / "fifo").exists()
    os.unlink(inside / "fifo")
    assert content_hash(out) == content_hash(inside)
    assert (out / "etc").is_symlink() and os.readlink(out / "etc") == "/etc"
    assert oct((out / "sub" / "run.sh").stat().st_mode & 0o7777) == "0o755"  # no setuid
    assert not processes.copy_out(os.getpid(), str(tmp_path / "missing"), tmp_path / "none")
    assert not processes.copy_out(os.getpid(), str(inside / "etc"), tmp_path / "none")  # a symlinked dir


def test_a_file_inside_is_read_without_following_a_symlink(tmp_path: Path) -> None:
    """/proc/<pid>/root of this process is the host root: the same walk a container's files get."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "status").write_text("0\n" + "x" * 100)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "to-shadow").symlink_to("/etc/hostname")
    me = os.getpid()
    assert processes.read_inside(me, f"{tmp_path}/real/status", max_bytes=2 + 100) == b"0\n" + b"x" * 100
    assert processes.read_inside(me, f"{tmp_path}/real/status", max_bytes=3) == b"xxx"  # the tail
    assert processes.read_inside(me, f"{tmp_path}/link/status") is None  # a symlinked directory
    assert processes.read_inside(me, f"{tmp_path}/real/to-shadow") is None  # a symlinked file
    assert processes.read_inside(me, f"{tmp_path}/real/missing") is None
    assert processes.read_inside(2**22 + 7, "/etc/hostname") is None  # no such process (container gone)
    with pytest.raises(ValueError):
        processes.read_inside(me, "../etc/passwd")


def test_the_endpoint_is_the_config_else_docker_host_else_a_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2375")
    assert engine.resolve_endpoint("unix:///x.sock") == "unix:///x.sock"
    assert engine.resolve_endpoint(None) == "tcp://10.0.0.1:2375"
    monkeypatch.delenv("DOCKER_HOST")
    expected = engine.PODMAN_SOCKET if engine.PODMAN_SOCKET.exists() else engine.DOCKER_SOCKET
    assert engine.resolve_endpoint(None) == f"unix://{expected}"


def test_extra_labels_are_key_value_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(engine.EXTRA_LABELS_ENV, "ci.job=17, team = rl")
    assert engine.extra_labels() == {"ci.job": "17", "team": "rl"}
    monkeypatch.setenv(engine.EXTRA_LABELS_ENV, "novalue")
    with pytest.raises(ValueError, match="'novalue' is not key=value"):
        engine.extra_labels()


def test_no_engine_is_one_line_naming_the_endpoint(tmp_path: Path) -> None:
    with pytest.raises(engine.ContainerEngineError) as e:
        engine.connect(f"unix://{tmp_path}/none.sock", 2.0)
    assert str(e.value) == f"no container engine answers at unix://{tmp_path}/none.sock: no such socket"


def test_what_is_inside_is_found_without_following_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    me = os.getpid()
    assert processes.exists_inside(me, f"{tmp_path}/real")
    assert processes.exists_inside(me, f"{tmp_path}/real/dangling")  # a symlink is something
    assert not processes.exists_inside(me, f"{tmp_path}/link/dangling")  # not through a symlinked dir
    assert not processes.exists_inside(me, f"{tmp_path}/missing/x")
