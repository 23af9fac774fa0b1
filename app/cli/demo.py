"""`gyre demo`: the main job on the embedded default (what `make demo` runs).

Starts the local stack (NATS, Redis, every service, K = 3 cell agents), trains on the demo tasks
through the demo harness for `--steps` optimizer steps with live progress, shuts down cleanly and
writes `runs/<run>/summary.json`, `role_timeline.png` and `reward_staleness.png`. Ctrl-C or SIGTERM
stops the run within 20 s (exit status 128 + signal).

`--mode async|colocate` runs a baseline at the demo's own target staleness E[d] = φ + (μ − 1)/2
(1.0 for the packaged φ = 0.5, μ = 2): async (E[d], 1) with one fixed training cell, colocate
(0, 2·E[d] + 1), as `gyre bench e2e` compares them (`matched_phi_mu`).

A run that trained (almost) nothing says so at the end, on stderr: no step trained a token, most
executions contributed no trainable token, model calls the proxy refused (by reason, with the latest
message). Exit status: 0, 1 when the stack failed, 2 on a bad config or model, 3 when the run completed
but no optimizer step trained a single token.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import typer

from app.cli._config import config_or_exit
from app.demo.config import mode_config

TRAINED_NOTHING_EXIT = 3
"""Exit status of a run that completed its steps without training a single token."""


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        config: Path | None = typer.Option(
            None, "--config", "-c", help="YAML overlaid on the demo settings."
        ),
        steps: int | None = typer.Option(
            None, "--steps", help="Optimizer steps (default: scheduler.max_steps)."
        ),
        mode: str | None = typer.Option(None, "--mode", help="elastic, async or colocate."),
        run_id: str | None = typer.Option(None, "--run-id", help="Run id (default demo-<time>)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as the last line."),
    ) -> None:
        """Run elastic RL on the demo tasks and write the run report."""
        from app.demo.report import run_warnings, trained_nothing
        from app.demo.run import DemoRun, role_names
        from app.stack.launcher import StackError
        from gyre.config import ConfigError
        from gyre.model.arch import ModelError

        overrides: dict[str, Any] = {"run": {"id": run_id or time.strftime("demo-%Y%m%d-%H%M%S")}}
        cfg = config_or_exit(load=lambda: mode_config(config, overrides, mode))
        total = steps or cfg.scheduler.max_steps or 12

        def progress(st: Any, elapsed_s: float) -> None:
            reward = "  -  " if math.isnan(st.last_step_reward) else f"{st.last_step_reward:.3f}"
            running = st.counters.started - st.counters.finished
            queued = st.counters.dispatched - st.counters.started
            typer.echo(
                f"[{elapsed_s:6.0f}s] step {st.steps}/{total}  roles {role_names(st)}  waterlevel {st.waterlevel:3d}"
                f"  C_R {st.rollout_capacity:3d}  running {running:3d}  queued {queued:3d}  reward {reward}"
                f"  staleness {st.mean_staleness:.2f}",
                err=as_json,
            )

        sched = cfg.scheduler
        typer.echo(
            f"gyre demo: run {cfg.run.id}, {sched.mode} (φ={sched.phi:g}, μ={sched.mu}), {total} steps;"
            f" report in {cfg.run.path}",
            err=as_json,
        )
        try:
            summary = DemoRun(cfg, steps=total).execute(progress=progress)
        except (ModelError, ConfigError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        except StackError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        except SystemExit as e:
            if isinstance(e.code, int) and e.code > 128:
                typer.echo(
                    f"gyre demo: stopped by signal {e.code - 128}; every process of the run is down", err=True
                )
            raise
        if as_json:
            typer.echo(json.dumps(summary))
        else:
            typer.echo(json.dumps(summary, indent=2))
            typer.echo(f"gyre audit {cfg.run.path} recomputes this run from its primary data", err=True)
        warnings = run_warnings(summary)
        if warnings:
            rule = "!" * 78
            typer.echo(
                "\n".join(
                    [
                        rule,
                        f"gyre demo: WARNING: run {cfg.run.id} trained little or nothing",
                        *warnings,
                        f"(summary: {cfg.run.path / 'summary.json'})",
                        rule,
                    ]
                ),
                err=True,
            )
        if trained_nothing(summary):
            raise typer.Exit(TRAINED_NOTHING_EXIT)
