"""No import circles (docs/style.md §15): the modules of Gyre's packages import one another one way, so each can
be read knowing only what lies below it. Every import counts, as for the import-linter contracts: one inside
a function and one under `if TYPE_CHECKING:` tie two modules as much as one at the top. A circle fails the test,
which lists its modules and the imports that tie them; break it by moving the shared piece down or by a
protocol in the lower module, not by moving the import into a function.

The packages are the import-linter's root packages (`[tool.importlinter] root_packages` in pyproject.toml), and
the graph is grimp's, the one `lint-imports` checks the contracts on."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]


def root_packages() -> list[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return list(data["root_packages"])


def import_graph(packages: Iterable[str]) -> grimp.ImportGraph:
    return grimp.build_graph(*packages, exclude_type_checking_imports=False, cache_dir=None)


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, without recursion), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            step = next(imported, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.find_modules_directly_imported_by(step)))))
                elif step in on_stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe(graph: grimp.ImportGraph, circle: list[str]) -> str:
    """The circle's modules, then each import between two of them with its line."""
    members = set(circle)
    lines = [f"circle of {len(circle)} modules: {', '.join(circle)}"]
    for importer in circle:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(
                    f"    {importer} -> {imported} (line {detail['line_number']}: {detail['line_contents']})"
                )
    return "\n".join(lines)


def test_no_import_circle() -> None:
    graph = import_graph(root_packages())
    assert len(graph.modules) > 300  # the graph sees the tree
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(describe(graph, c) for c in found)


def test_a_circle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # lower -> upper at the top, upper -> lower inside a function, and a TYPE_CHECKING pair: two circles.
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "lower.py").write_text("from circled import upper\n")
    (package / "upper.py").write_text("def f():\n    from circled import lower\n")
    (package / "alone.py").write_text("from circled import lower\n")
    (package / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circled.hinted import X\n"
    )
    (package / "hinted.py").write_text("import circled.typed\nX = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = import_graph(["circled"])
    found = circles(graph)
    assert found == [["circled.hinted", "circled.typed"], ["circled.lower", "circled.upper"]]
    assert "circled.upper -> circled.lower (line 2: from circled import lower)" in describe(graph, found[1])
