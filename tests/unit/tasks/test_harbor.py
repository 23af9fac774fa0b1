"""Harbor task directories read as Harbor publishes them: instruction.md, task.toml, the Dockerfile's
WORKDIR and COPYs, tests/test.sh; solution/ ignored."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gyre.tasks import Problems, TaskError, TaskRegistry, WorkspaceSource
from gyre.tasks.dockerfile import instructions, read_dockerfile
from gyre.tasks.harbor import load_harbor_task

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "tasks" / "fix-add"


def test_the_example_task_maps_every_harbor_file() -> None:
    task = TaskRegistry([EXAMPLE]).get("tasks/fix-add")
    assert task.source == "harbor" and task.task_dir == EXAMPLE.resolve()
    assert task.prompt == (EXAMPLE / "instruction.md").read_text()
    assert (task.harness_timeout_s, task.verifier.timeout_s, task.overall_budget_s) == (300.0, 60.0, 420.0)
    assert task.verifier.argv == ("bash", "/tests/test.sh") and task.verifier.protocol == "harbor"
    assert task.verifier.tests_dir == EXAMPLE.resolve() / "tests"
    env = task.environment
    assert (env.workdir, env.dockerfile, env.build_timeout_s, env.cpus, env.memory_mb) == (
        "/app",
        EXAMPLE.resolve() / "environment" / "Dockerfile",
        300.0,
        1,
        1024,
    )
    context = EXAMPLE.resolve() / "environment"
    assert task.workspace == (
        WorkspaceSource(context / "calc.py", "calc.py"),
        WorkspaceSource(context / "test_calc.py", "test_calc.py"),
    )
    assert task.metadata["difficulty"] == "easy"
    assert all("solution" not in str(s.source) for s in task.workspace)


def test_defaults_follow_harbor_when_task_toml_is_minimal(tmp_path: Path) -> None:
    (tmp_path / "t" / "tests").mkdir(parents=True)
    (tmp_path / "t" / "instruction.md").write_text("Do it.")
    (tmp_path / "t" / "task.toml").write_text('version = "1.0"\n[task]\nname = "org/t"\n')
    (tmp_path / "t" / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    problems = Problems()
    task = load_harbor_task(tmp_path / "t", "x/t", problems)
    assert task is not None and not problems.errors
    assert (task.harness_timeout_s, task.verifier.timeout_s, task.overall_budget_s) == (600.0, 600.0, 1800.0)
    assert task.environment.workdir == "/app" and task.workspace == ()
    assert task.metadata["task"] == {"name": "org/t"}
    assert [w.message for w in problems.warnings] == [
        "no environment/Dockerfile and no [environment] docker_image: a container sandbox has no image; the local "
        "workspace at /app starts empty"
    ]


def test_dockerfile_workdir_and_copies_of_the_final_stage(tmp_path: Path) -> None:
    ctx = tmp_path / "environment"
    (ctx / "src" / "pkg").mkdir(parents=True)
    (ctx / "src" / "pkg" / "m.py").write_text("m")
    (ctx / "a.py").write_text("a")
    (ctx / "b.py").write_text("b")
    (ctx / "tool.sh").write_text("t")
    (ctx / "Dockerfile").write_text(
        "FROM golang AS build\nWORKDIR /build\nCOPY a.py .\n"
        "# the final stage\nFROM python:3.11-slim AS final\nWORKDIR /srv\nWORKDIR app\n"
        'COPY --chown=1000:1000 src/ ./src/\nCOPY ["a.py", "b.py", "/srv/app/lib/"]\nCOPY *.py \\\n  extra/\n'
        "ADD a.py renamed.py\nCOPY tool.sh /usr/local/bin/tool\nCOPY --from=build /build/a.py /srv/app/\n"
        "RUN apt-get update && \\\n    apt-get install -y git\n"
    )
    problems = Problems()
    facts = read_dockerfile(ctx / "Dockerfile", problems)
    assert facts.base_image == "python:3.11-slim" and facts.workdir == "/srv/app" and facts.num_run_steps == 1
    assert facts.workspace == (
        WorkspaceSource(ctx / "src", "src"),
        WorkspaceSource(ctx / "a.py", "lib/a.py"),
        WorkspaceSource(ctx / "b.py", "lib/b.py"),
        WorkspaceSource(ctx / "a.py", "extra/a.py"),
        WorkspaceSource(ctx / "b.py", "extra/b.py"),
        WorkspaceSource(ctx / "a.py", "renamed.py"),
    )
    assert not problems.errors
    text = "\n".join(w.message for w in problems.warnings)
    assert "line 14: COPY --from=build" in text and "1 RUN step(s)" in text
    assert (
        "copies outside the working directory are not reproduced in the local workspace: line 13 → /usr/local/bin/tool"
        in text
    )
    assert instructions("RUN a \\\n # comment\n  b\n")[0] == (1, "RUN", "a  b")


def test_a_dockerfile_without_workdir_or_with_workdir_root(tmp_path: Path) -> None:
    ctx = tmp_path / "t" / "environment"
    ctx.mkdir(parents=True)
    (ctx / "Dockerfile").write_text("FROM alpine\nCOPY . /app\n")
    problems = Problems()
    facts = read_dockerfile(ctx / "Dockerfile", problems)
    assert facts.workdir == "/app" and facts.workspace == (WorkspaceSource(ctx, ""),)
    assert "no WORKDIR: the workspace is taken to be /app" in problems.warnings[0].message
    (ctx / "Dockerfile").write_text("FROM alpine\nWORKDIR /\n")
    (tmp_path / "t" / "instruction.md").write_text("x")
    (tmp_path / "t" / "task.toml").write_text("")
    (tmp_path / "t" / "tests").mkdir()
    (tmp_path / "t" / "tests" / "test.sh").write_text("")
    problems = Problems()
    assert load_harbor_task(tmp_path / "t", "s/t", problems) is None
    assert "WORKDIR /: the workspace cannot be the root directory" in problems.errors[0].message


def test_a_malformed_task_toml_is_refused_naming_file_and_key(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "set" / "fix-add")
    toml = tmp_path / "set" / "fix-add" / "task.toml"
    toml.write_text(
        toml.read_text().replace("[environment]\n", '[environment]\ngpus = -1\nallow_internet = "yes"\n')
    )
    registry = TaskRegistry([tmp_path / "set"])
    with pytest.raises(TaskError) as e:
        registry.get("set/fix-add")
    message = str(e.value)
    assert f"{toml.resolve()}: [environment] gpus: must be a non-negative integer; got -1" in message
    assert f"{toml.resolve()}: [environment] allow_internet: must be true or false; got 'yes'" in message


def test_the_verifier_opt_ins_are_read_and_checked(tmp_path: Path) -> None:
    """`[verifier] agent_paths` (relative paths, carried alone into the verifier) and `same_container`."""
    shutil.copytree(EXAMPLE, tmp_path / "set" / "fix-add")
    toml = tmp_path / "set" / "fix-add" / "task.toml"
    base = toml.read_text()
    toml.write_text(base.replace("[verifier]\n", '[verifier]\nagent_paths = ["calc.py", "src/x"]\n'))
    task = TaskRegistry([tmp_path / "set"]).get("set/fix-add")
    assert (task.verifier.agent_paths, task.verifier.same_container) == (("calc.py", "src/x"), False)
    toml.write_text(base.replace("[verifier]\n", "[verifier]\nsame_container = true\n"))
    task = TaskRegistry([tmp_path / "set"]).get("set/fix-add")
    assert (task.verifier.agent_paths, task.verifier.same_container) == (None, True)
    for bad in ('["/etc/passwd"]', '["../x"]', "[]", '"calc.py"', '["."]'):
        toml.write_text(base.replace("[verifier]\n", f"[verifier]\nagent_paths = {bad}\n"))
        with pytest.raises(
            TaskError, match=r"\[verifier\] agent_paths: must be a non-empty list of relative"
        ):
            TaskRegistry([tmp_path / "set"]).get("set/fix-add")
