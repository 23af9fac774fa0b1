"""`gyre tasks check` names every defect of a deliberately broken task set, each with its path (and
the key, for task.toml), exits 1 on errors and 0 on a clean task; `gyre tasks list` shows what a
config dispatches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from app.cli import app

REPO = Path(__file__).resolve().parents[3]
BROKEN = REPO / "tests" / "fixtures" / "tasks" / "broken"
EXAMPLE = REPO / "examples" / "tasks" / "fix-add"


def _check(*paths: Path) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["tasks", "check", *map(str, paths)])
    return result.exit_code, result.output.splitlines()


def test_check_names_every_defect_of_a_broken_set_with_its_path_and_key() -> None:
    code, lines = _check(BROKEN)
    assert code == 1
    errors = [ln.removeprefix("error: ") for ln in lines if ln.startswith("error: ")]
    b = str(BROKEN)
    expected = [
        f"{b}/many-defects/instruction.md: missing: a Harbor task needs instruction.md (the prompt)",
        f"{b}/many-defects/tests/test.sh: missing: a Harbor task needs tests/test.sh (the verifier)",
        f"{b}/many-defects/task.toml: [agent] timeout_sec: must be a positive number of seconds; got -5",
        f"{b}/many-defects/task.toml: [verifier] timeout_sec: must be a positive number of seconds; got 'ten'",
        f"{b}/many-defects/task.toml: [environment] cpus: must be a positive integer; got 1.5",
        f"{b}/many-defects/environment/Dockerfile: line 3: COPY missing.py: no such file in the build context",
        f"{b}/bad-toml/task.toml: not valid TOML: Expected ']' at the end of a table declaration (at line 1",
        f"{b}/bad-yaml/task.yaml: colour: unknown key",
        f"{b}/bad-yaml/task.yaml: harness_timeout_s: must be a positive number of seconds; got -1",
        f"{b}/empty-instruction/instruction.md: empty",
        f"{b}/table-not-table/task.toml: [agent]: must be a table; got 3",
    ]
    for want in expected:
        assert sum(e.startswith(want) for e in errors) == 1, (want, errors)
    assert len(errors) == len(expected), errors
    warnings = [ln for ln in lines if ln.startswith("warning: ")]
    assert any("[verifier] timout_sec: not a key Harbor or Gyre reads" in w for w in warnings)
    assert any("1 RUN step(s): applied only in the task's image" in w for w in warnings)
    assert lines[-1] == f"5 task(s) checked: {len(expected)} error(s), {len(warnings)} warning(s)"


def test_one_broken_task_checked_on_its_own_and_a_clean_one(tmp_path: Path) -> None:
    code, lines = _check(BROKEN / "table-not-table")
    assert code == 1 and any("table-not-table/task.toml: [agent]: must be a table" in ln for ln in lines)
    code, lines = _check(EXAMPLE)
    assert (code, lines) == (0, ["1 task(s) checked: 0 error(s), 0 warning(s)"])
    code, lines = _check(tmp_path / "nowhere")
    assert code == 1 and "not a task directory, a set of them or a .jsonl dataset" in lines[0]


def test_check_reads_a_dataset_and_names_bad_lines(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "fix-add")
    data = tmp_path / "train.jsonl"
    data.write_text(
        '{"task": "fix-add", "weight": 2}\n\n{"task": "add/3+5", "wieght": 1}\n{"weight": 1}\nnot json\n'
        '{"task": "./nope"}\n{"task": "add/1+1", "weight": -1}\n'
    )
    code, lines = _check(data)
    assert code == 1
    assert [ln.split(": ", 2)[1] for ln in lines if ln.startswith("error")] == [
        f"{data}:3",
        f"{data}:4",
        f"{data}:5",
        f"{data}:6",
        f"{data}:7",
    ]
    text = "\n".join(lines)
    assert "wieght: unknown key" in text and "task: required" in text and "not a JSON object" in text
    assert "'./nope' is not a task directory" in text and "weight: must be a number >= 0; got -1" in text
    assert lines[-1].startswith("1 task(s) checked: 5 error(s)")


def test_list_shows_suite_id_weight_share_format_and_source(tmp_path: Path) -> None:
    tasks = tmp_path / "mytasks"
    shutil.copytree(EXAMPLE, tasks / "fix-add")
    (tasks / "echo").mkdir()
    (tasks / "echo" / "task.yaml").write_text('prompt: "echo ok > out.txt"\nverifier: ["true"]\n')
    config = tmp_path / "gyre.yaml"
    config.write_text(
        f"tasks:\n  dirs: [{tasks}]\n  queries: [mytasks, add/3+5]\n  weights: {{mytasks/fix-add: 2}}\n"
    )
    result = CliRunner().invoke(app, ["tasks", "list", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["queries"]
    assert [(r["suite"], r["task"], r["weight"], r["format"], r["source"]) for r in rows] == [
        ("mytasks", "mytasks/echo", 1.0, "task.yaml", "tasks.queries"),
        ("mytasks", "mytasks/fix-add", 2.0, "harbor", "tasks.queries"),
        ("add", "add/3+5", 1.0, "builtin", "tasks.queries"),
    ]
    assert [round(r["share"], 2) for r in rows] == [0.25, 0.5, 0.25]
    text = CliRunner().invoke(app, ["tasks", "list", "--config", str(config)]).output
    assert text.splitlines()[0].split() == ["suite", "id", "weight", "share", "format", "source"]
    assert "mytasks/fix-add" in text and "3 task(s) in 2 suite(s)" in text


def test_list_and_check_name_the_file_and_key_of_a_malformed_task_toml(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "tasks" / "fix-add")
    toml = tmp_path / "tasks" / "fix-add" / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 300.0", "timeout_sec = 0"))
    config = tmp_path / "gyre.yaml"
    config.write_text(f"tasks:\n  dirs: [{tmp_path / 'tasks'}]\n")
    result = CliRunner().invoke(app, ["tasks", "list", "--config", str(config)])
    assert result.exit_code == 1
    assert (
        f"{toml.resolve()}: [agent] timeout_sec: must be a positive number of seconds; got 0" in result.output
    )
    code, lines = _check(tmp_path / "tasks")
    assert (
        code == 1
        and f"error: {tmp_path / 'tasks' / 'fix-add' / 'task.toml'}: [agent] timeout_sec" in lines[0]
    )
