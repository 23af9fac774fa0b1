"""The design document lives in the repository (docs/) and stays true to the tree: every relative link of
every Markdown file resolves to a file inside the repository, no file points at a document outside it,
and every path the docs name in backticks (the read-this-first walk names dozens) exists."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP = {
    ".git",
    ".venv",
    "node_modules",
    "runs",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    "gyre.egg-info",
}
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
CODE_PATH = re.compile(r"`((?:gyre|services|harness|sim|bench|deploy|tests|protos|docs|examples)/[\w./-]*)`")
OUTSIDE = re.compile(r"\.\./shared|/work/shared|shared/(?:DESIGN|FACTS|STYLE)\.md|shared/reference/")


def repo_files(*suffixes: str) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP]
        found += [Path(root, f) for f in files if Path(f).suffix in suffixes]
    return found


def test_every_relative_markdown_link_resolves_inside_the_repository() -> None:
    broken = []
    for md in repo_files(".md"):
        for target in LINK.findall(md.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            resolved = (md.parent / target).resolve()
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append(f"{md.relative_to(REPO)} -> {target}")
    assert broken == []


def test_no_file_points_at_a_document_outside_the_repository() -> None:
    found = [
        f"{p.relative_to(REPO)}:{n}"
        for p in repo_files(".md", ".py", ".toml", ".yaml", ".yml", ".txt", ".sh")
        if p != Path(__file__).resolve()
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == []


def test_readme_links_the_design_document() -> None:
    readme = (REPO / "README.md").read_text()
    assert "(docs/design.md)" in readme and "(docs/read-this-first.md)" in readme


def test_the_paths_the_docs_name_exist() -> None:
    missing = [
        f"{md.name}: {path}"
        for md in sorted((REPO / "docs").glob("*.md"))
        if md.name != "facts.md"  # it quotes other formats' paths (a Harbor task's tests/test.sh)
        for path in CODE_PATH.findall(md.read_text())
        if not (REPO / path.rstrip("/")).exists()
    ]
    assert len(CODE_PATH.findall((REPO / "docs" / "read-this-first.md").read_text())) > 50
    assert missing == []


PY_NAME = re.compile(r"(?<![\w.])((?:[\w{},*-]+/)*[\w{},*-]+\.py)\b")
MAP_LINE = re.compile(r"^\s{2,}([\w.-]+/?)\s{2,}\S", re.M)
REPO_DIRS = ("gyre/", "services/", "harness/", "sim/", "bench/", "deploy/", "tests/", "docs/", "protos/")


def _expand(name: str) -> list[str]:
    """`{a,b}_api.py` → a_api.py, b_api.py (globs stay globs)."""
    m = re.search(r"\{([^}]*)\}", name)
    if m is None:
        return [name]
    return [e for alt in m.group(1).split(",") for e in _expand(name[: m.start()] + alt + name[m.end() :])]


def _resolves(package: Path, name: str) -> bool:
    bases = [package, *package.parents] if not name.startswith(REPO_DIRS) else [REPO]
    return all(
        any(list(base.glob(n)) if "*" in n else (base / n).exists() for base in bases) for n in _expand(name)
    )


def test_package_docstrings_name_files_that_exist() -> None:
    """Every `.py` file a package docstring names, every repository path it names in backticks and every
    entry of a map of the package (`    name.py      what it does`) exists (relative to the package or a
    package above it, or the repository)."""
    import ast

    missing = []
    for top in ("gyre", "services", "harness", "sim", "bench"):
        for init in sorted((REPO / top).rglob("__init__.py")):
            if init.is_relative_to(REPO / "gyre" / "v1"):
                continue
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            names = {*PY_NAME.findall(doc), *MAP_LINE.findall(doc)}
            names |= set(CODE_PATH.findall(doc))
            missing += [
                f"{init.relative_to(REPO)}: {n}" for n in sorted(names) if not _resolves(init.parent, n)
            ]
    assert missing == []
