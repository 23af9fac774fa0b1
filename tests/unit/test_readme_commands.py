"""Every `gyre` command README shows is run by some test, so none rots unnoticed: each command (and each
subcommand of a group) README names, in a code block or inline, must appear as an argument list in a test
(`["sim", "validate", ...]`, `*GYRE, "up", "--detach"`, `_gyre("status", ...)`). The benchmarks are
tests/integration/test_benches.py's table, which checks itself against `gyre bench --list`."""

from __future__ import annotations

import re
from pathlib import Path

from app.cli import app

REPO = Path(__file__).resolve().parents[2]


def _commands() -> dict[str, set[str]]:
    """Top-level command → its subcommands (empty for a plain command)."""
    out: dict[str, set[str]] = {c.name or "": set() for c in app.registered_commands}
    for group in app.registered_groups:
        out[group.name or ""] = {c.name or "" for c in group.typer_instance.registered_commands}
    return out


def readme_commands() -> set[tuple[str, ...]]:
    """(command,) or (group, subcommand) of every `gyre …` README shows."""
    commands = _commands()
    found: set[tuple[str, ...]] = set()
    for first, second in re.findall(
        r"\bgyre ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", (REPO / "README.md").read_text()
    ):
        if first not in commands or first == "bench":
            continue
        if commands[first]:
            if second in commands[first]:
                found.add((first, second))
        else:
            found.add((first,))
    return found


def _tests_text() -> str:
    return "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py") if p.name != Path(__file__).name)


def test_every_command_readme_shows_is_run_by_a_test() -> None:
    text = _tests_text()
    missing = []
    for command in sorted(readme_commands()):
        words = r"\s*,\s*".join(rf"[\"']{re.escape(w)}[\"']" for w in command)
        # an argument list: the command's words as consecutive string items, after `[`, `(`, `,` or `*X,`
        if not re.search(rf"[\[(,]\s*{words}\s*[,\])]", text):
            missing.append(" ".join(command))
    assert not missing, f"README shows gyre commands no test runs: {missing}"


def test_the_readme_scan_finds_the_commands_it_should() -> None:
    found = readme_commands()
    assert {("up",), ("status",), ("down",), ("audit",), ("sim", "validate"), ("model", "init")} <= found
