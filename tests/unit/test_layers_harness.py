"""Layers: no module outside `harness/` imports the demo harness (shared/DESIGN.md; the task contract
lives in gyre/tasks). Lazy imports inside functions count too. Tests are outside the rule only where
they test the harness itself (tests/unit/harness), so they are not scanned."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("gyre", "services", "sim", "bench")


def harness_imports(path: Path) -> list[int]:
    """Lines of `path` that import `harness` (at any depth: module level, functions, TYPE_CHECKING)."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            lines += [node.lineno for a in node.names if a.name.split(".")[0] == "harness"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "harness":
            lines.append(node.lineno)
    return lines


def test_no_module_outside_harness_imports_harness() -> None:
    files = [p for root in SCANNED for p in sorted((REPO / root).rglob("*.py")) if "v1" not in p.parts]
    assert len(files) > 150
    offenders = {str(p.relative_to(REPO)): found for p in files if (found := harness_imports(p))}
    assert offenders == {}


def test_the_scan_sees_lazy_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from harness.tasks import Task\n    import harness\n    import harnessy\n")
    assert harness_imports(probe) == [2, 3]


def test_the_services_and_the_task_library_load_without_the_harness() -> None:
    code = (
        "import sys\n"
        "import gyre.tasks, gyre.cli, services.runner.service, services.evaluator.service, services.scheduler.service\n"
        "from gyre.tasks import TaskSet\n"
        "from gyre.config.tasks import TasksSection\n"
        "TaskSet.from_section(TasksSection()).registry.get('add/3+5')\n"
        "print(sorted(m for m in sys.modules if m == 'harness' or m.startswith('harness.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
