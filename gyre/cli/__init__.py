"""The `gyre` command line. Every module in this package that defines `register(app)` adds its
commands, so a new command group is one new file.

    gyre --help
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

app = typer.Typer(
    name="gyre",
    help="Elastic RL for xLong-horizon agents: local stack, demo, simulator, benchmarks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_all()


def main() -> None:
    app()
