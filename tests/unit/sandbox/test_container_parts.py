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


def test_the_environment_digest_follows_content_modes_and_base_ids_not_times(tmp_path: Path) -> None:
    env = _env(tmp_path)
    bases = {"localhost/gyre/debian-base:bookworm": "c1ba65d982e1"}
    first = images.environment_digest(env, bases)
    os.utime(env / "run.sh", (1, 1))
    assert images.environment_digest(env, bases) == first
    (env / "run.sh").chmod(0o755)
    executable = images.environment_digest(env, bases)
    assert executable != first
    (env / "run.sh").write_text("echo ho\n")
    content = images.environment_digest(env, bases)
    assert content not in (first, executable)
    # A base rebuilt under the same name (a new id), or absent from the host, is another digest.
    rebuilt = images.environment_digest(env, {"localhost/gyre/debian-base:bookworm": "0a1b2c3d4e5f"})
    absent = images.environment_digest(env, {"localhost/gyre/debian-base:bookworm": ""})
    assert len({content, rebuilt, absent, images.environment_digest(env, {})}) == 4
    (env / "link").symlink_to("run.sh")
    tag = images.image_tag(env, bases)
    assert tag.startswith("localhost/gyre/env:") and len(tag) == 19 + 24


@pytest.mark.parametrize(
    ("dockerfile", "bases"),
    [
        ("FROM localhost/gyre/debian-base:bookworm\nRUN true\n", ["localhost/gyre/debian-base:bookworm"]),
        (  # multi-stage: a stage's name or index is not an image; COPY --from an image is
            "FROM base:1 AS Build\nRUN make\nFROM --platform=linux/amd64 build AS test\n"
            "FROM other:2\nCOPY --from=build /a /a\nCOPY --from=0 /b /b\nCOPY --from=tools:3 /c /c\n",
            ["base:1", "other:2", "tools:3"],
        ),
        (  # global ARG defaults, continuation lines, comments, scratch
            "# escape=\\\nARG TAG=12\nARG REPO\nFROM \\\n  debian:${TAG}-slim\n# a comment\n"
            "FROM ${REPO:-localhost/x}:$TAG AS two\nFROM scratch\nCOPY --from=two / /\n",
            ["debian:12-slim", "localhost/x:12"],
        ),
        ("# escape=`\nFROM win:1 `\n  AS a\nFROM a\n", ["win:1"]),
    ],
)
def test_the_images_a_dockerfile_builds_from_are_each_from_that_names_one(
    dockerfile: str, bases: list[str]
) -> None:
    assert images.dockerfile_images(dockerfile) == bases


def test_build_parameters_bound_network_memory_and_cpu_in_each_engines_terms() -> None:
    podman = images.build_params(True, False, 512, 1.5, "gyre-build-x")
    assert podman == {
        "networkmode": "NetworkDisabled",  # podman's compat endpoint ignores Docker's "none"
        "cgroupparent": "gyre-build-x",
        "memory": 512 << 20,
        "memswap": 512 << 20,
        "cpuperiod": 100_000,
        "cpuquota": 150_000,
    }
    online = images.build_params(True, True, None, None, None)
    assert online["networkmode"] == "NetworkEnabled"  # its own namespace, not the host's
    assert '"Host": false' in online["nsoptions"] and set(online) == {"networkmode", "nsoptions"}
    assert images.build_params(False, False, None, None, None) == {"networkmode": "none"}
    assert images.build_params(False, True, 64, None, None) == {"memory": 64 << 20, "memswap": 64 << 20}


def test_the_processes_of_a_build_are_found_by_their_cgroup(tmp_path: Path) -> None:
    for pid, lines in {
        "7": "4:memory:/process_api/ab/gyre-build-x1\n1:cpu:/gyre-build-x1\n",
        "8": "0::/gyre-build-x10\n",
        "9": "0::/system.slice/gyre-build-x1/sub\n",
    }.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cgroup").write_text(lines)
    (tmp_path / "self").mkdir()
    assert sorted(images.cgroup_pids("gyre-build-x1", tmp_path)) == [7, 9]


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
