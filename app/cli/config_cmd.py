"""`gyre config show [--file F]`: print the resolved config (file ← GYRE_* env) as YAML."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from app.cli._config import config_or_exit

config_app = typer.Typer(help="Inspect the resolved configuration.", no_args_is_help=True)


@config_app.command("show")
def show(file: Path | None = typer.Option(None, "--file", "-f", help="YAML config file.")) -> None:
    """Print the resolved config; exit 2 with a one-line error naming the field if it is invalid."""
    config = config_or_exit(file)
    typer.echo(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False).rstrip())


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
