"""Loading the config for a command: a bad config exits 2 with the one-line error naming the field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from gyre import tls
from gyre.config import ConfigError, GyreConfig, load_config
from gyre.tls import tls_files


def config_or_exit(
    file: Path | None = None,
    load: Callable[[], GyreConfig] | None = None,
    identity: str | None = "cli",
) -> GyreConfig:
    """`load_config(file)`, or `load()` when given (e.g. the demo's layered settings). With `tls.enabled`,
    the command talks to the deployment as `identity` (`gyre.tls`; None: it talks to none, as `gyre tls
    init`, which writes the certificates instead of reading them)."""
    try:
        config = load() if load is not None else load_config(file)
        if identity is not None:
            tls.configure(tls_files(config.tls, identity))
    except (ConfigError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    return config
