"""The `gyre` command line. Every module in this package that defines `register(app)` adds its
commands, so a new command group is one new file. Command groups of the floor above the app (`gyre bench`,
`gyre sim`) are entry points of the group `gyre.commands` (pyproject.toml), loaded by name: the app imports
no benchmark and no simulator module.

    gyre --help

Standard output carries a command's own output and nothing else (a command that prints JSON prints only
JSON: `gyre trace replay FILE | jq` works); log lines go to standard error, at `GYRE_LOG__LEVEL`
(default warning) in `GYRE_LOG__FORMAT` (default auto). A command that loads a run's config may log at
the config's `log.level` from there on.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from importlib.metadata import entry_points

import typer

from gyre.log import configure_logging

app = typer.Typer(
    name="gyre",
    help="Elastic RL for xLong-horizon agents: local stack, demo, simulator, benchmarks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _logging_to_stderr() -> None:
    level = os.environ.get("GYRE_LOG__LEVEL", "warning")
    log_format = os.environ.get("GYRE_LOG__FORMAT", "auto")
    configure_logging(log_format if log_format in ("auto", "json", "console") else "auto", level)  # type: ignore[arg-type]


#: The entry-point group through which the floors above the app add command groups.
COMMAND_GROUP = "gyre.commands"


def _register_all() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)
    for entry in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        entry.load()(app)


_register_all()


def main() -> None:
    app()
