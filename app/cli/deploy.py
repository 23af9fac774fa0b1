"""`gyre deploy check-kube SOURCE`: the kubelet's rules a pod dies of, checked over rendered manifests
(app/deploy/kube_check.py), one line per finding. `gyre deploy nats-permissions --config C`: nats-server's
users of the deploy shape for C's run id (app/deploy/access.py; deploy/nats/permissions.conf).

    gyre deploy check-kube deploy/k8s/overlays/cpu        # a kustomization, rendered by kubectl
    kubectl kustomize deploy/k8s/overlays/gpu | gyre deploy check-kube -

Exit 0 when no pod of the manifests breaks a rule, 1 with each finding on its own line, 2 when the
manifests cannot be read. Prerequisites (objects the cluster must hold beforehand) come from the nearest
`prerequisites.yaml` above SOURCE, plus `--prerequisite KIND/NAME` (fnmatch patterns).
"""

from __future__ import annotations

from pathlib import Path

import typer

deploy_app = typer.Typer(help="Checks of the deployment files that need no cluster.", no_args_is_help=True)


@deploy_app.command("check-kube")
def check_kube(
    source: Path = typer.Argument(..., help="A kustomization directory, a YAML file of manifests, or -."),
    prerequisite: list[str] = typer.Option([], "--prerequisite", help="KIND/NAME the cluster holds already."),
) -> None:
    """Check rendered Kubernetes manifests for what stops a pod from starting."""
    from app.deploy.kube_check import check_manifests, pod_specs
    from app.deploy.kustomize import find_prerequisites, load_manifests

    try:
        manifests = load_manifests(source)
    except (OSError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    patterns = [*find_prerequisites(source), *prerequisite] if str(source) != "-" else list(prerequisite)
    findings = check_manifests(manifests, patterns)
    for finding in findings:
        typer.echo(str(finding))
    num_pods = sum(1 for _ in pod_specs(manifests))
    typer.echo(
        f"{len(findings)} findings over {num_pods} pod templates of {len(manifests)} objects", err=True
    )
    if findings:
        raise typer.Exit(1)


@deploy_app.command("nats-permissions")
def nats_permissions(
    config: Path = typer.Option(..., "--config", help="The deployment's Gyre config (its run id)."),
    out: Path | None = typer.Option(None, "--out", help="File to write (default: stdout)."),
) -> None:
    """nats-server's users of the deploy shape, one per certificate identity, from gyre/bus/permissions.py."""
    from app.cli._config import config_or_exit
    from app.deploy.access import nats_permissions as render
    from gyre.config import load_config

    loaded = config_or_exit(load=lambda: load_config(config, environ={}), identity=None)
    text = render(loaded.run.id)
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)


def register(app: typer.Typer) -> None:
    app.add_typer(deploy_app, name="deploy")
