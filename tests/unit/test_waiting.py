"""Tests wait on conditions, never on the clock (a fixed sleep is what makes a test fail once in twenty
runs on a loaded machine): every wait goes through tests/support/eventually.py, and a sleep elsewhere in
tests/ says on its line (`# scenario: ...`) that it stages what the test is about — a timeout that must
lapse, a slow or silent peer, staggered arrivals, a process that idles until it is killed."""

from __future__ import annotations

import re
from pathlib import Path

from gyre.paths import REPO_ROOT

SLEEP = re.compile(r"\b(?:time|asyncio)\.sleep\(")
HELPER = REPO_ROOT / "tests" / "support" / "eventually.py"
PLANTED = "await asyncio." + "sleep(0.5)"


def unexplained_sleeps(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        if path != HELPER
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SLEEP.search(line) and "# scenario:" not in line
    ]


def test_tests_wait_on_conditions_not_on_the_clock() -> None:
    assert unexplained_sleeps(REPO_ROOT / "tests") == []


def test_a_fixed_sleep_is_found(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(f"{PLANTED}\n{PLANTED}  # scenario: the timeout lapses\n")
    assert unexplained_sleeps(tmp_path) == [f"test_x.py:1: {PLANTED}"]
