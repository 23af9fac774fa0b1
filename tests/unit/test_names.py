"""One name, one thing (docs/style.md §16): a public class name is defined once in the package tree.

Every module of the five packages is parsed (not imported); a top-level class whose name does not start
with `_` is public, and two modules defining the same public name fail the test, naming both. The
generated protobuf code (gyre/v1) is not ours and is left out."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from gyre.paths import REPO_ROOT

PACKAGES = ("gyre", "services", "app", "harness", "sim", "bench")


def public_classes(root: Path = REPO_ROOT) -> dict[str, list[str]]:
    """Public class name → the modules (paths relative to `root`) that define it at top level."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path.is_relative_to(root / "gyre" / "v1"):
                continue
            for node in ast.parse(path.read_text(), filename=str(path)).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    found[node.name].append(str(path.relative_to(root)))
    return found


def duplicates(found: dict[str, list[str]]) -> list[str]:
    return [f"{name}: {', '.join(paths)}" for name, paths in sorted(found.items()) if len(paths) > 1]


def test_every_public_class_name_is_defined_once() -> None:
    found = public_classes()
    assert len(found) > 300  # the walk sees the tree
    assert duplicates(found) == []


def test_a_second_definition_is_found(tmp_path: Path) -> None:
    for package, source in (
        ("gyre", "class Role:\n    pass\n"),
        ("services", "class Role(str):\n    pass\n"),
    ):
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "roles.py").write_text(source)
    assert duplicates(public_classes(tmp_path)) == ["Role: gyre/sub/roles.py, services/sub/roles.py"]
