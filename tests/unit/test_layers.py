"""The layers of docs/design.md hold: the import-linter contracts of pyproject.toml (`[tool.importlinter]`:
library ← services ← app ← bench, sim; no service imports another, nothing outside harness/ imports harness,
the pure core imports no I/O library) are kept, as `make lint` checks them; the contracts see the code they are
about (a contract that the code breaks is reported broken); and the floors, read from the same import graph,
name the import that would climb a floor (a module of gyre/ importing services/ or the app)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
#: The floors, top down, as the `floors` contract states them (a test below checks they agree).
FLOORS = ["bench | sim", "app", "services", "gyre"]


def lint_imports(config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), str(config), "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def contracts() -> dict[str, dict[str, object]]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in data["contracts"]}


def test_every_import_contract_is_kept(tmp_path: Path) -> None:
    result = lint_imports(REPO / "pyproject.toml", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in result.stdout


def test_a_contract_the_code_breaks_is_reported_broken(tmp_path: Path) -> None:
    # The runner does import the library's sandbox, lazily or not: a contract forbidding it must fail.
    config = tmp_path / "probe.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["gyre", "services"]\n'
        '[[tool.importlinter.contracts]]\nname = "probe"\ntype = "forbidden"\n'
        'source_modules = ["services.runner"]\nforbidden_modules = ["gyre.sandbox"]\n'
    )
    result = lint_imports(config, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "services.runner.execution -> gyre.sandbox" in result.stdout


def test_the_floors_contract_is_the_floors_of_the_docs() -> None:
    assert contracts()["floors"]["layers"] == FLOORS
    assert contracts()["library"]["source_modules"] == ["gyre"]


def build_graph() -> grimp.ImportGraph:
    return grimp.build_graph("gyre", "services", "app", "bench", "sim", cache_dir=None)


def floor_violations(graph: grimp.ImportGraph) -> list[str]:
    """Every import chain that climbs a floor, as `floor -> floor: module -> … -> module` lines."""
    layers = [grimp.Layer(*(name.strip() for name in floor.split("|"))) for floor in FLOORS]
    lines = []
    for dependency in graph.find_illegal_dependencies_for_layers(layers=layers):
        for route in dependency.routes:
            chain = " -> ".join([",".join(sorted(route.heads)), *route.middle, ",".join(sorted(route.tails))])
            lines.append(f"{dependency.importer} -> {dependency.imported}: {chain}")
    return sorted(lines)


def test_no_import_climbs_a_floor() -> None:
    assert floor_violations(build_graph()) == []


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("gyre.rl.loss", "services.packer.rows"),
        ("gyre.config.runner", "app.stack.launcher"),
        ("services.proxy.app", "app.cli"),
        ("app.demo.run", "bench.e2e"),
    ],
)
def test_an_import_up_a_floor_is_named(importer: str, imported: str) -> None:
    graph = build_graph()
    graph.add_import(importer=importer, imported=imported, line_number=1, line_contents="probe")
    floors = f"{importer.split('.')[0]} -> {imported.split('.')[0]}"
    assert f"{floors}: {importer} -> {imported}" in floor_violations(graph)
