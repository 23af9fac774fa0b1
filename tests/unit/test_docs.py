"""The design document lives in the repository (docs/) and stays true to the tree: every relative link of
every Markdown file resolves to a file inside the repository, no file points at a document outside it,
every path the docs name in backticks (the read-this-first walk names dozens) exists, and so does every
class, function and constant the maps name (in the file they name it with), every file a package docstring
names, and every directory and package of README's layout."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Collection
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
CODE_PATH = re.compile(
    r"`((?:gyre|services|app|harness|sim|bench|deploy|tests|protos|docs|examples)/[\w./-]*)`"
)
OUTSIDE = re.compile(r"\.\./shared|/work/shared|shared/(?:DESIGN|FACTS|STYLE)\.md|shared/reference/")


def repo_files(*suffixes: str) -> list[Path]:
    """The repository's files with these suffixes: tracked, or untracked and not ignored (what git ignores,
    virtual environments and caches among them, is not the repository's)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    paths = [REPO / name for name in listed.split("\0") if name]
    return [p for p in paths if p.suffix in suffixes and p.is_file() and not SKIP.intersection(p.parts)]


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


MAPS = ("read-this-first.md", "design.md")
"""The documents that walk the code: every name they give is checked against the tree."""
CODE_NAME = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\([^`]*\))?`")
MATH = re.compile(r"[A-Za-z]_[A-Za-z]\w*")  # `J_max`, `C_s`, `s_i`: the method's symbols
FILE_THEN_NAME = re.compile(
    r"`((?:gyre|services|harness|sim|bench)/[\w/]+\.py)`(?:,\s*|\s+)`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)(?:\(\))?`"
)
EXTERNAL = {
    "LlamaForCausalLM": "transformers' architecture names, as config.json carries them",
    "Qwen2ForCausalLM": "",
    "Qwen3ForCausalLM": "",
    "Qwen3MoeForCausalLM": "",
    "AutoModelForCausalLM.from_pretrained": "transformers",
}


def _top_level_names(path: Path) -> set[str]:
    """What a module defines at its top level: classes, functions, assignments, and `Class.member` for
    each method, nested class and annotated field of a class."""
    import ast

    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
            for sub in node.body if isinstance(node, ast.ClassDef) else []:
                if isinstance(sub, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{sub.name}")
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    names.add(f"{node.name}.{sub.target.id}")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _defined_names() -> tuple[set[str], set[str]]:
    """Every name the tree defines — module-level and class-level Python definitions (with `Class.member`
    and a method's own name), the protos' messages, enums, their values and RPCs, Python's builtins — and
    every identifier-shaped string it holds (config values, JSON fields: `scored_script`, `lora_path`)."""
    import ast
    import builtins

    names, strings = set(dir(builtins)), set()
    for top in ("gyre", "services", "harness", "sim", "bench"):
        for path in (REPO / top).rglob("*.py"):
            if not path.is_relative_to(REPO / "gyre" / "v1"):
                found = _top_level_names(path)
                names |= found | {n.rpartition(".")[2] for n in found}
                strings |= {
                    node.value
                    for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value.isidentifier()
                }
    for proto in (REPO / "protos").rglob("*.proto"):
        text = proto.read_text()
        names |= set(re.findall(r"^\s*(?:message|enum|service)\s+(\w+)", text, re.M))
        names |= set(re.findall(r"\brpc\s+(\w+)", text)) | set(
            re.findall(r"^\s*(\w+)\s*=\s*\d+;", text, re.M)
        )
    return names, strings


def _module_name_exists(dotted: str, defined: set[str]) -> bool | None:
    """`gyre.service.GyreService`: the longest prefix that is a module, then what is left defined in it
    (in a generated module, `gyre.v1.TreeNode`, a proto's name). None when no prefix past the top
    package is a module: not a module path (`gyre.r1.exec.terminated` is a NATS subject)."""
    parts = dotted.split(".")
    for k in range(len(parts), 1, -1):
        base = REPO.joinpath(*parts[:k])
        module = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if module.exists():
            rest = ".".join(parts[k:])
            if base.is_relative_to(REPO / "gyre" / "v1"):
                return rest in defined
            return not rest or rest in _top_level_names(module)
    return None


def stale_names(text: str, defined: set[str], strings: Collection[str] = ()) -> list[str]:
    """The code names a document gives in backticks that the tree does not define: a class or
    `Class.member` (CamelCase), a dotted module path (`gyre.errors.StartupError`), a constant
    (`ERROR_STATUSES`) or a function (`fill_batch`; a snake-case value the code holds as a string, such
    as `scored_script`, counts too). Lower-case dotted names are config keys and single lower-case words
    are prose; the method's symbols (`J_max`) are not code."""
    stale = []
    for name in CODE_NAME.findall(text):
        head = name.split(".")[0]
        if name in EXTERNAL or MATH.fullmatch(name):
            continue
        if head in ("gyre", "services", "harness", "sim", "bench") and "." in name:
            ok = _module_name_exists(name, defined) is not False
        elif head[0].isupper():
            ok = name in defined or (head.isupper() and "_" not in name)  # `RUN`, `HOME`: not Python
        elif "." not in name and "_" in name.strip("_"):
            ok = name in defined or name in strings
        else:
            continue
        if not ok:
            stale.append(name)
    return stale


def test_the_names_the_maps_give_are_defined() -> None:
    """read-this-first.md and design.md name classes, methods, functions and constants the reader is to
    open; each one is defined in the tree (a rename that leaves a map behind fails here), and so is each
    class README names (its upper-case words are mostly environment variables and Dockerfile keywords)."""
    defined, strings = _defined_names()
    stale = {md: stale_names((REPO / "docs" / md).read_text(), defined, strings) for md in MAPS}
    readme = stale_names((REPO / "README.md").read_text(), defined, strings)
    stale["README.md"] = [n for n in readme if n[0].isupper() and not n.split(".")[0].isupper()]
    assert {md: names for md, names in stale.items() if names} == {}


def test_a_name_given_with_its_file_is_defined_in_that_file() -> None:
    """`services/packer/batch.py` `fill_batch`: a name right after a file is defined in that file (a
    function that moves to another module leaves its old file behind in the map)."""
    pairs = [
        (md, path, name)
        for md in MAPS
        for path, name in FILE_THEN_NAME.findall((REPO / "docs" / md).read_text().replace("\n", " "))
        if not name.endswith(".py")
    ]
    assert len(pairs) > 30
    misplaced = [
        f"{md}: {path} `{name}`" for md, path, name in pairs if name not in _top_level_names(REPO / path)
    ]
    assert misplaced == []


def test_stale_names_are_found() -> None:
    defined = {"GyreService", "Router.drain", "fill_batch"}
    text = (
        "`Router.drain` `fill_batch` `Router.gone` `Supervisor` `unknown_function` `proxy.matching` `J_max`"
    )
    assert stale_names(text, defined) == ["Router.gone", "Supervisor", "unknown_function"]


def _layout_block() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Layout") :]
    return section[section.index("```") + 3 : section.index("```", section.index("```") + 3)]


def test_readme_layout_names_every_top_directory_and_package() -> None:
    """README's layout names every directory of the repository and every package of gyre/, and each
    path and file a row names exists."""
    block = _layout_block()
    rows = re.findall(r"^(\S.*?)(?:\s{2,}|$)", block, re.M)
    paths = [p.strip() for row in rows for p in row.split(",")]
    assert [p for p in paths if not (REPO / p.strip("/").replace("<name>", "")).exists()] == []
    gyre_row = block[block.index("\ngyre/ ") : block.index("\nservices/")]
    assert [f for f in re.findall(r"\b(\w+\.py)\b", gyre_row) if not (REPO / "gyre" / f).exists()] == []
    tops = {
        p.name for p in REPO.iterdir() if p.is_dir() and p.name not in SKIP and not p.name.startswith(".")
    }
    assert {t for t in tops - {"runs", "build", "dist"} if f"{t}/" not in block} == set()
    packages = {p.parent.name for p in (REPO / "gyre").glob("*/__init__.py")} - {"v1"}
    named = {p for p in packages if f"gyre/{p}" in block or re.search(rf"\b{p}\b", gyre_row)}
    assert packages - named == set()
