"""`gyre cell drain ID`: give a cell of a live local-stack run notice that it leaves the pool.

    gyre cell drain 2                  # the configured run, else the only live one
    gyre cell drain 2 --run demo-20261207-170000

The scheduler's `DrainCell` (services/scheduler/departure.py) takes the cell out of the pool while the run
goes on: a rollout satellite stops taking calls, its in-flight calls move to the other engines with their
KV, and it leaves; a training satellite leaves at once, the micro-steps it claimed going back to the other
training cells; then the stack's supervisor stops its cell agent (a planned departure, not restarted).
The command returns once the calls moved and prints what moved. A notice the scheduler refuses (an unknown
cell, the core, a cell already gone, a cell switching roles, the only rollout engine) prints one line and
exits 2, with nothing changed. A drain the proxy failed (the cell left all the same; its calls in flight fail
over instead of moving with their KV) prints the proxy's reason and exits 1.
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

_REFUSED = ("INVALID_ARGUMENT", "FAILED_PRECONDITION")


@cell_app.command("drain")
def drain_cmd(
    cell: int = typer.Argument(..., help="The cell's index (0 is the core)."),
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config file."),
    run: str | None = _RUN_OPTION,
    timeout_s: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the cell's calls to move."),
) -> None:
    """The cell stops taking calls, its in-flight calls move to the other engines with their KV, it leaves (a
    training satellite: its claimed micro-steps go back to the others)."""
    import grpc

    from app.stack.servers import LOOPBACK
    from app.stack.state import StackState
    from gyre.v1 import scheduler_pb2, scheduler_pb2_grpc

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
    with sync_channel(f"{LOOPBACK}:{scheduler.grpc_port}") as channel:
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
