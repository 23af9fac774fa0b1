"""No function of the package tree is over 120 lines (docs/style.md: files and functions that fit the idea;
a long function reads as named steps instead). Nested functions count inside the function that holds
them, as a reader meets them."""

from __future__ import annotations

import ast
from pathlib import Path

from gyre.paths import REPO_ROOT

PACKAGES = ("gyre", "services", "harness", "sim", "bench")
MAX_LINES = 120


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path.is_relative_to(root / "gyre" / "v1"):
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > limit:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_120_lines() -> None:
    assert long_functions(REPO_ROOT) == []


def test_a_long_function_is_found(tmp_path: Path) -> None:
    (tmp_path / "gyre").mkdir()
    (tmp_path / "gyre" / "m.py").write_text("def f():\n" + "    x = 1\n" * 121)
    assert long_functions(tmp_path) == ["gyre/m.py:1 f (122 lines)"]
