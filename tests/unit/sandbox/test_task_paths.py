"""A task's absolute environment paths: bind mounts in the sandbox's own mount namespace (root), or
rewritten to host directories; never created on the host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gyre.sandbox import SandboxError, SandboxSpec
from gyre.sandbox.task_paths import PathMap, harness_layout
from tests.support.sandboxes import launcher_for_test

UID_BASE = 175000
SUPPORTED = ["process", "isolated"] if os.geteuid() == 0 else ["process"]


def test_rewrite_replaces_whole_paths_only_longest_first(tmp_path: Path) -> None:
    paths = PathMap(
        [(tmp_path / "ws", "/app"), (tmp_path / "logs", "/logs/verifier"), (tmp_path / "t", "/tests")],
        bind=False,
    )
    text = (
        "cd /app && python3 /tests/t.py > /logs/verifier/reward.txt; cat /app/x.py '/app'\n"
        "/application /usr/app /app.d /tests2 ./app x/tests"
    )
    assert paths.rewrite(text) == (
        f"cd {tmp_path}/ws && python3 {tmp_path}/t/t.py > {tmp_path}/logs/reward.txt; cat {tmp_path}/ws/x.py "
        f"'{tmp_path}/ws'\n/application /usr/app /app.d /tests2 ./app x/tests"
    )
    assert paths.cwd("/app") == tmp_path / "ws" and paths.binds() == ()
    bound = PathMap([(tmp_path / "ws", "/app")], bind=True)
    assert bound.rewrite("cd /app") == "cd /app" and bound.cwd("/app") == Path("/app")
    assert bound.binds() == ((tmp_path / "ws", "/app"),)
    with pytest.raises(ValueError, match="absolute and below /"):
        PathMap([(tmp_path, "/")], bind=True)


def test_rewrite_tree_rewrites_text_files_and_leaves_binaries_and_links(tmp_path: Path) -> None:
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "test.sh").write_text("cat /app/a\n")
    (tmp_path / "tests" / "sub" / "blob.bin").write_bytes(b"\xff\xfe/app")
    (tmp_path / "tests" / "link").symlink_to(tmp_path / "tests" / "test.sh")
    changed = PathMap([(tmp_path / "ws", "/app")], bind=False).rewrite_tree(tmp_path / "tests")
    assert changed == [tmp_path / "tests" / "test.sh"]
    assert (tmp_path / "tests" / "test.sh").read_text() == f"cat {tmp_path}/ws/a\n"
    assert (tmp_path / "tests" / "sub" / "blob.bin").read_bytes() == b"\xff\xfe/app"


def _spec(tmp_path: Path, script: str, binds: tuple[tuple[Path, str], ...], cwd: Path) -> SandboxSpec:
    return SandboxSpec(
        name="t",
        argv=["bash", "-c", script],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin"},
        root=tmp_path / "box",
        writable=tuple(s for s, _ in binds),
        binds=binds,
    )


@pytest.mark.parametrize("name", SUPPORTED)
async def test_binds_are_seen_at_their_paths_or_refused_and_the_host_is_untouched(
    name: str, tmp_path: Path
) -> None:
    ws, logs = tmp_path / "ws", tmp_path / "logs"
    ws.mkdir()
    logs.mkdir()
    (ws / "calc.py").write_text("x")
    binds = ((ws, "/gyre-test-app"), (logs, "/gyre-test-logs/verifier"), (ws, "/usr/share/gyre-test-nested"))
    script = "pwd > /gyre-test-logs/verifier/pwd; ls /usr/share/gyre-test-nested > /gyre-test-logs/verifier/ls; id -u"
    launcher = launcher_for_test(name, UID_BASE, 1)
    spec = _spec(tmp_path, script, binds, Path("/gyre-test-app"))
    if not launcher.mounts_paths:  # `process`: no mount namespace, so callers rewrite the paths instead
        with pytest.raises(SandboxError, match="cannot bind-mount paths; rewrite them instead"):
            await launcher.launch(spec)
        return
    handle = await launcher.launch(spec)
    outcome = await handle.wait()
    await handle.release()
    assert outcome.exit_code == 0, outcome.describe()
    assert (logs / "pwd").read_text().strip() == "/gyre-test-app"
    assert (logs / "ls").read_text().split() == ["calc.py"]
    assert (handle.control_dir / "stdout.log").read_text().strip() == str(UID_BASE)
    for made in ("/gyre-test-app", "/gyre-test-logs", "/usr/share/gyre-test-nested"):
        assert not Path(made).exists(), made


def test_harness_layout_of_a_plain_and_of_a_harbor_task(tmp_path: Path) -> None:
    from gyre.tasks import Task, TaskEnvironment

    ws = tmp_path / "ws"
    plain = harness_layout(Task("s/p", "edit /app/x"), ws, bind=True)
    assert (plain.prompt, plain.cwd, plain.writable, plain.binds, plain.agent_logs) == (
        "edit /app/x",
        ws,
        (ws,),
        (),
        None,
    )
    harbor = Task(
        "s/h", "Fix /app/calc.py; logs go to /logs/agent.", environment=TaskEnvironment(workdir="/app")
    )
    logs = tmp_path / "ws.agent-logs"
    mounted = harness_layout(harbor, ws, bind=True)
    assert (mounted.prompt, mounted.cwd, mounted.binds) == (
        harbor.prompt,
        Path("/app"),
        ((ws, "/app"), (logs, "/logs/agent")),
    )
    rewritten = harness_layout(harbor, ws, bind=False)
    assert (rewritten.prompt, rewritten.cwd, rewritten.binds) == (
        f"Fix {ws}/calc.py; logs go to {logs}.",
        ws,
        (),
    )
    assert rewritten.writable == (ws, logs) == mounted.writable
