"""The layers of docs/design.md hold: the import-linter contracts of pyproject.toml (`[tool.importlinter]`:
library ← services ← app, no service imports another, nothing outside harness/ imports harness, the pure
core imports no I/O library) are kept, as `make lint` checks them; the contracts see the code they are about
(a contract that the code breaks is reported broken); and the library contract lists every library package."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
APP = {"gyre.audit", "gyre.cli", "gyre.demo", "gyre.stack"}


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


def test_the_library_contract_names_every_library_package() -> None:
    packages = {
        f"gyre.{p.stem}"
        for p in (REPO / "gyre").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    listed = set(contracts()["library"]["source_modules"])  # type: ignore[arg-type]
    assert listed == packages - APP
