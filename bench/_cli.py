"""`gyre bench NAME [ARGS...]`: run `bench/NAME.py`, whose last printed line is one JSON object. The `gyre`
command loads this module as the entry point `bench` of the group `gyre.commands` (pyproject.toml).

Benchmarks are not tests: they measure medians and ratios in one run on a shared machine.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

import bench


def _names() -> list[str]:
    """Benchmark names: the modules of bench/, with `-` for `_` (`bench/tree_train.py` is `tree-train`)."""
    return sorted(
        m.name.replace("_", "-") for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")
    )


def register(app: typer.Typer) -> None:
    @app.command(
        "bench",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def run_bench(
        ctx: typer.Context,
        name: str = typer.Argument("", help="Benchmark name (a module of bench/)."),
        list_: bool = typer.Option(False, "--list", help="List the benchmarks."),
        json_: bool = typer.Option(
            False,
            "--json",
            help="Accepted by every benchmark: standard output is one JSON object (progress goes to stderr).",
        ),
    ) -> None:
        """Run one benchmark; its last output line is a JSON object."""
        names = _names()
        if list_ or not name:
            typer.echo("\n".join(names))
            return
        if name not in names:
            typer.echo(f"error: unknown benchmark {name!r}; choose one of: {', '.join(names)}", err=True)
            raise typer.Exit(2)
        module = importlib.import_module(f"bench.{name.replace('-', '_')}")
        module.main(list(ctx.args))
