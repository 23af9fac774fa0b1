"""The policy is pure: it imports the standard library and itself, nothing that does I/O."""

import ast
import subprocess
import sys
from pathlib import Path

POLICY = Path(__file__).resolve().parents[3] / "services" / "scheduler" / "policy"
ALLOWED_ROOTS = {"__future__", "collections", "dataclasses", "enum", "math", "typing", "services"}
FORBIDDEN = (
    "grpc",
    "nats",
    "redis",
    "asyncio",
    "sglang",
    "megatron",
    "mooncake",
    "torch",
    "numpy",
    "pydantic",
)


def _runtime_imports(tree: ast.Module) -> set[str]:
    """Top-level module names imported outside `if TYPE_CHECKING:` blocks."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_policy_modules_import_only_the_standard_library_and_the_policy():
    files = sorted(POLICY.glob("*.py"))
    assert len(files) >= 10
    for path in files:
        tree = ast.parse(path.read_text())
        assert _runtime_imports(tree) <= ALLOWED_ROOTS, path.name
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("services."):
                assert node.module.startswith("services.scheduler.policy"), (path.name, node.module)


def test_importing_the_policy_loads_no_io_library():
    code = (
        "import sys, services.scheduler.policy as p\n"
        f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=POLICY.parents[2]
    )
    assert out.stdout.strip() == ""
