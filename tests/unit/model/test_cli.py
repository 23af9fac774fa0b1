"""`gyre model init | inspect`: the commands a user makes and checks a model directory with."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from app.cli import app


def test_init_writes_what_inspect_reports(tmp_path: Path) -> None:
    out = tmp_path / "m"
    runner = CliRunner()
    made = runner.invoke(
        app,
        [
            "model",
            "init",
            "--out",
            str(out),
            "--arch",
            "qwen3",
            "--context",
            "65536",
            "--vocab-size",
            "8192",
            "--seed",
            "3",
        ],
    )
    assert made.exit_code == 0, made.output
    shown = runner.invoke(app, ["model", "inspect", str(out)])
    assert shown.exit_code == 0, shown.output
    info = json.loads(shown.output)
    assert info["architecture"] == "Qwen3ForCausalLM" and info["template_family"] == "qwen3"
    assert (
        info["context_length"]
        == 65536
        == json.loads((out / "config.json").read_text())["max_position_embeddings"]
    )
    assert info["vocab_size"] == 8192


def test_init_names_a_bad_option(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", "init", "--out", str(tmp_path / "m"), "--size", "huge"])
    assert result.exit_code != 0 and "--size" in result.output and not (tmp_path / "m").exists()
