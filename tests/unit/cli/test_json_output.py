"""Every `gyre` command that prints JSON prints nothing else on standard output: its whole stdout parses
as JSON (`gyre trace replay FILE | jq` works), and log lines go to standard error.

Each command runs from an unconfigured logging state, as in a fresh process (structlog's default prints
to stdout, which is how a `fast_bpe_unused` debug line once reached `gyre trace replay`'s output). The
table covers every command with a `--json` option and every command that always prints JSON; a new one
fails `test_the_table_names_every_json_command` until it has a row or a reason here."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog
import typer
from typer.testing import CliRunner

from app.cli import app

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ALWAYS_JSON = {"model init", "model inspect", "trace replay"}
"""Commands without a `--json` option whose output is JSON."""
ELSEWHERE = {
    "audit": "needs a finished run: tests/e2e/test_audit.py parses the whole stdout of `gyre audit RUN --json`",
    "bench": "tests/integration/test_benches.py parses the whole stdout of every benchmark's tiny run",
    "demo": "runs the whole stack for minutes: tests/e2e/test_silent_run.py parses its whole stdout",
    "resume": "resumes a stopped demo run (tests/faults/test_resume.py)",
}
"""JSON commands run by other tests, and why not here. (`gyre events tail` prints one JSON object per line;
tests/integration/test_events_cli.py parses each line of its stdout.)"""


def _commands() -> dict[str, bool]:
    """Every leaf command (`sim run`) → whether it has a `--json` option."""
    found: dict[str, bool] = {}

    def walk(command: Any, path: list[str]) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
            return
        options = {o for p in command.params for o in getattr(p, "opts", [])}
        found[" ".join(path)] = "--json" in options

    walk(typer.main.get_command(app), [])
    return found


def _capture(tmp_path: Path) -> Path:
    body = {"model": "m", "max_tokens": 8, "system": "s", "messages": [{"role": "user", "content": "hi"}]}
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(body))
    return path


def _measured(tmp_path: Path) -> Path:
    result = json.loads((FIXTURES / "sim_e2e" / "bench.json").read_text())
    result["runs"] = {m: {**r, "run_dir": str(FIXTURES / "sim_e2e" / m)} for m, r in result["runs"].items()}
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps(result))
    return path


def _runs(tmp_path: Path) -> dict[str, list[list[str]]]:
    model = str(tmp_path / "model")
    return {
        "model init": [["model", "init", "--out", model, "--tokenizer", "byte"]],
        "model inspect": [["model", "inspect", model]],
        "model verify-template": [["model", "verify-template", model, "--json"]],
        "trace replay": [["trace", "replay", str(_capture(tmp_path))]],
        "tasks list": [["tasks", "list", "--json"]],
        "status": [["status", "--json", "--run", "no-such-run"]],
        "sim run": [["sim", "run", "--steps", "2", "--json"]],
        "sim ablation": [["sim", "ablation", "--steps", "2", "--json"]],
        "sim presets": [["sim", "presets", "--json"]],
        "sim validate": [
            ["sim", "validate", "--measured", str(_measured(tmp_path)), "--seeds", "1", "--json"]
        ],
    }


def _unconfigured_logging() -> None:
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)


def test_the_table_names_every_json_command(tmp_path: Path) -> None:
    json_commands = {name for name, has_json in _commands().items() if has_json} | ALWAYS_JSON
    assert json_commands == set(_runs(tmp_path)) | set(ELSEWHERE)


def test_each_json_command_prints_only_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # `status` and `tasks list` read the default config; runs/ lands here
    monkeypatch.delenv("GYRE_LOG__LEVEL", raising=False)
    runner = CliRunner()
    for name, runs in _runs(tmp_path).items():  # in order: `model init` makes the directory the next read
        for args in runs:
            _unconfigured_logging()
            result = runner.invoke(app, args)
            assert result.exit_code == 0, f"{name}: {result.output}"
            try:
                json.loads(result.stdout)
            except ValueError:
                pytest.fail(f"gyre {' '.join(args)}: stdout is not one JSON document:\n{result.stdout[:500]}")


def test_logs_go_to_stderr_at_the_level_asked_for(tmp_path: Path) -> None:
    # A fresh process, as a user runs it: the byte tokenizer's template logs `fast_bpe_unused` at debug.
    env = {**os.environ, "GYRE_LOG__LEVEL": "debug"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from app.cli import main; main()",
            "trace",
            "replay",
            str(_capture(tmp_path)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["profile"] == "generic"
    assert "fast_bpe_unused" in done.stderr
