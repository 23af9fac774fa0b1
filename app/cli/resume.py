"""`gyre resume RUN`: continue a run after every process of it died (a crash, a reboot, `kill -9`).

    gyre resume demo-20261201-130000            # runs/<RUN>, to the step count it was started with
    gyre resume runs/demo-20261201-130000 --json

The run comes back on its own resolved config (app/stack/resume.py): the scheduler from its persisted
state and event stream, the core from its newest checkpoint, the queues from Redis; then it trains to its
step count and writes its report as `gyre demo` does, over the whole run's events.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer


def register(app: typer.Typer) -> None:
    @app.command("resume")
    def resume(
        run: str = typer.Argument(..., help="Run id (under --runs-dir) or a run directory."),
        runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run directories live."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as the last line."),
    ) -> None:
        """Continue a run whose processes all died, from its last checkpoint and persisted scheduler state."""
        from app.demo.run import DemoRun, role_names
        from app.stack.launcher import StackError
        from gyre.config import ConfigError

        run_dir = (
            Path(run) if Path(run).is_dir() and (Path(run) / "config.yaml").is_file() else runs_dir / run
        )
        try:
            demo = DemoRun.resuming(run_dir)
        except (OSError, ConfigError) as e:
            typer.echo(f"error: cannot resume {run_dir}: {e}", err=True)
            raise typer.Exit(2) from None

        def progress(st: Any, elapsed_s: float) -> None:
            reward = "  -  " if math.isnan(st.last_step_reward) else f"{st.last_step_reward:.3f}"
            typer.echo(
                f"[{elapsed_s:6.0f}s] step {st.steps}/{demo.steps}  roles {role_names(st)}  "
                f"running {st.counters.started - st.counters.finished:3d}  reward {reward}",
                err=as_json,
            )

        typer.echo(
            f"gyre resume: run {demo.config.run.id} to {demo.steps} steps; report in {run_dir}", err=as_json
        )
        try:
            summary = demo.execute(progress=progress)
        except StackError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        typer.echo(json.dumps(summary) if as_json else json.dumps(summary, indent=2))
