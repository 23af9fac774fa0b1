"""`gyre tls init`: a deployment's CA and a certificate per identity, for `tls.enabled` (gyre.tls).

    gyre tls init --config deploy/compose/gyre.yaml --out deploy/compose/tls --group 10001

Each identity's names come from the config: a service's peer host (each cell's for its own identity,
`cell_agent-<k>`: CN `cell_agent` and the URI `urn:gyre:cell:<k>`, gyre.tls), the
hosts of `nats.url` and `redis.url`, plus `--dns IDENTITY=NAME` (a Kubernetes FQDN, say); every
certificate also names localhost and 127.0.0.1. `--group` makes the keys readable by that group (0640):
the containers' user (10001 in deploy/docker/Dockerfile) is not the user who runs this. The files are laid
out as a cert-manager Certificate's secret (`<identity>/tls.crt`, `tls.key`, `ca.crt`), so Kubernetes
can mount either. Beside them, what NATS and Redis need of each identity for the config's run id
(app/deploy/access.py): `<identity>/redis.json` (its Redis ACL user and a fresh password, 0600 or 0640 with
`--group`), `redis/users.acl` (the server's ACL file) and `nats/permissions.conf` (the server's users, by
certificate subject). Prints the directory of each identity, one JSON object.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import typer

from gyre.config import GyreConfig
from gyre.tls import cell_directory

tls_app = typer.Typer(help="Transport security between hosts (tls.enabled).", no_args_is_help=True)

CLIENT_IDENTITIES = ("cli",)
"""Identities of tools outside the deployment (`gyre status`, `gyre bench cluster`)."""


def identities(config: GyreConfig, extra: list[str]) -> dict[str, list[str]]:
    """Each identity's DNS names: the services', the servers', the clients' (none), plus `extra`."""
    run = config.run
    names: dict[str, list[str]] = {}
    for service in ("scheduler", "proxy", "runner", "evaluator", "packer"):
        names[service] = [run.peer_host(service)]
    for cell in range(config.scheduler.num_cells):  # one certificate per cell: none can pose as another
        names[cell_directory(cell)] = [run.peer_host("cell_agent", cell)]
    for server, url in (("nats", config.nats.url), ("redis", config.redis.url)):
        host = urlsplit(url).hostname if url else None
        names[server] = [host] if host else []
    for client in CLIENT_IDENTITIES:
        names[client] = []
    for item in extra:
        identity, sep, name = item.partition("=")
        if not sep or identity not in names or not name:
            raise typer.BadParameter(
                f"--dns {item!r}: use IDENTITY=NAME with IDENTITY one of {', '.join(names)}"
            )
        names[identity].append(name)
    return names


@tls_app.command("init")
def init(
    out: Path = typer.Option(..., "--out", help="Directory to write (tls.dir of the deployment)."),
    config: Path | None = typer.Option(None, "--config", help="The deployment's Gyre config."),
    dns: list[str] = typer.Option([], "--dns", help="Another name of an identity: IDENTITY=NAME."),
    group: int | None = typer.Option(None, "--group", help="Group that may read the keys (0640)."),
    days: int = typer.Option(365, "--days", min=1, help="Validity of the CA and the certificates."),
) -> None:
    """Write a new CA and every identity's key and certificate under OUT."""
    from app.cli._config import config_or_exit
    from app.deploy.access import write_access
    from gyre.config import load_config
    from gyre.tls import KEY_FILE, issue

    # The config as the deployment will run it; its certificates are what this writes, so none is read.
    loaded = config_or_exit(load=lambda: load_config(config, environ={}), identity=None)
    written = issue(out, identities(loaded, dns), days=days)
    # Redis passwords and ACL file, NATS permissions: its run id (every cell's directory gets the cells' login)
    access = write_access(out, loaded.run.id, cells=loaded.scheduler.num_cells)
    if group is not None:
        try:
            for directory in written.values():
                for path in (directory, directory / KEY_FILE):
                    os.chown(path, -1, group)
                (directory / KEY_FILE).chmod(0o640)
            for path in access.values():
                os.chown(path, -1, group)
                path.chmod(0o640 if path.stat().st_mode & 0o077 == 0 else 0o644)
        except PermissionError:
            typer.echo(
                f"error: --group {group}: only root or a member of group {group} can give it the keys "
                f"(run gyre tls init as root, e.g. with sudo); {out} holds keys only you can read",
                err=True,
            )
            raise typer.Exit(2) from None
    typer.echo(json.dumps({identity: str(path) for identity, path in written.items()}))


def register(app: typer.Typer) -> None:
    app.add_typer(tls_app, name="tls")
