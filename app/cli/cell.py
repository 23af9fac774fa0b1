"""`gyre cell drain ID`: give a cell of a live local-stack run notice that it leaves the pool;
`gyre cell notice`: a cell of a deployment gives its own.

    gyre cell drain 2                  # the configured run, else the only live one
    gyre cell drain 2 --run demo-20261207-170000
    gyre cell notice --config /etc/gyre/gyre.yaml    # in a cell's pod (its preStop): as the cell itself

The scheduler's `DrainCell` (services/scheduler/departure.py) takes the cell out of the pool while the run
goes on: a rollout satellite stops taking calls, its in-flight calls move to the other engines with their
KV, and it leaves; a training satellite leaves at once, the micro-steps it claimed going back to the other
training cells; then the stack's supervisor stops its cell agent (a planned departure, not restarted).
The command returns once the calls moved and prints what moved. A notice the scheduler refuses (an unknown
cell, the core, a cell already gone, a cell switching roles, the only rollout engine) prints one line and
exits 2, with nothing changed. A drain the proxy failed (the cell left all the same; its calls in flight fail
over instead of moving with their KV) prints the proxy's reason and exits 1.

`gyre cell notice` is the same notice sent by the cell itself, as its own TLS identity: its certificate names
its cell (`urn:gyre:cell:K`, gyre.tls), and the scheduler takes a cell's notice for that cell alone
(gyre.authz `OWN_CELL`), so a cell's key cannot send another cell away. Kubernetes runs it as the cell pod's
`preStop` hook (deploy/k8s/base/cell-agent.yaml), so a pod stopped with its grace period (a preemption
notice, a drained node) moves its calls before its SIGTERM.
"""

from __future__ import annotations

from pathlib import Path

import typer

from app.cli._config import config_or_exit
from app.cli.stack import _RUN_OPTION, _run_dir
from gyre.rpc import sync_channel

cell_app = typer.Typer(
    help="Cells of a live run: give one notice that it leaves the pool.", no_args_is_help=True
)

_REFUSED = ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED")


@cell_app.command("drain")
def drain_cmd(
    cell: int = typer.Argument(..., help="The cell's index (0 is the core)."),
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config file."),
    run: str | None = _RUN_OPTION,
    timeout_s: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the cell's calls to move."),
) -> None:
    """The cell stops taking calls, its in-flight calls move to the other engines with their KV, it leaves (a
    training satellite: its claimed micro-steps go back to the others)."""
    from app.stack.servers import LOOPBACK
    from app.stack.state import StackState

    run_dir = _run_dir(config_or_exit(config), run)
    state = StackState.load(run_dir)
    scheduler = next((p for p in state.processes if p.name == "scheduler"), None) if state else None
    if scheduler is None or cell < 0:
        typer.echo(
            f"error: cell must be 0 or more; got {cell}"
            if cell < 0
            else f"nothing running for run {run_dir.name!r}",
            err=True,
        )
        raise typer.Exit(2 if cell < 0 else 1)
    _give_notice(f"{LOOPBACK}:{scheduler.grpc_port}", cell, timeout_s)


@cell_app.command("notice")
def notice_cmd(
    config: Path = typer.Option(..., "--config", "-c", help="The deployment's config (gyre.yaml)."),
    cell: int | None = typer.Option(
        None, "--cell", help="The cell (default: the one its certificate names)."
    ),
    timeout_s: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the cell's calls to move."),
) -> None:
    """This cell's own notice, in a deployment: what a cell pod's `preStop` runs before it is stopped (a
    preemption, a drained node). Talks to the config's scheduler as the cell's own identity (its certificate,
    which names the cell: the scheduler takes a cell's notice for its own cell only)."""
    from gyre import tls
    from gyre.tls import tls_files

    loaded = config_or_exit(config, identity=None)
    try:  # with --cell, the certificate must be that cell's
        files = tls_files(loaded.tls, tls.CELL_AGENT, cell)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    tls.configure(files)
    mine = files.cell if files is not None else cell
    if mine is None:
        typer.echo(
            "error: --cell is needed: "
            + (
                "TLS is off (no certificate names the cell)"
                if files is None
                else f"{files.cert} names no cell"
            ),
            err=True,
        )
        raise typer.Exit(2)
    _give_notice(f"{loaded.run.peer_host('scheduler')}:{loaded.scheduler.port}", mine, timeout_s)


def _give_notice(address: str, cell: int, timeout_s: float) -> None:
    """`DrainCell(cell)` to the scheduler at `address`; prints what moved (exit 2: refused, 1: failed)."""
    import grpc

    from gyre.v1 import scheduler_pb2, scheduler_pb2_grpc

    with sync_channel(address) as channel:
        try:
            resp = scheduler_pb2_grpc.SchedulerStub(channel).DrainCell(
                scheduler_pb2.DrainCellRequest(cell=cell), timeout=timeout_s
            )
        except grpc.RpcError as e:
            typer.echo(f"error: {e.details() or e.code().name}", err=True)
            raise typer.Exit(2 if e.code().name in _REFUSED else 1) from None
    typer.echo(
        f"cell {resp.cell} left the pool in {resp.duration_s:.1f} s: {resp.executions_moved} executions and "
        f"{resp.calls_rerouted} calls in flight moved, {resp.kv_migrated_tokens} KV tokens migrated; "
        "the stack stops its cell agent"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(cell_app, name="cell")
