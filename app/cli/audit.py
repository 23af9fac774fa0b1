"""`gyre audit RUN [--json]`: a finished run's outcome recomputed from primary data (app/audit/).

RUN is a run directory, or a run id under `runs/`. Exit 0 when the replayed training, the group ledger and
the accounting hold and agree with the run's report; 1 with each defect on its own line (in `defects` with
`--json`); 2 when RUN is not a finished run.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("audit")
    def audit_cmd(
        run: str = typer.Argument(..., help="Run directory, or a run id under runs/."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        replay: bool = typer.Option(True, "--replay/--no-replay", help="Recompute the training."),
        probe: bool = typer.Option(
            True,
            "--probe/--no-probe",
            help="Also measure what one micro-step applied twice or skipped does to each step.",
        ),
    ) -> None:
        """Recompute a finished run from its primary data: training replay, what reached the loss, group
        ledger, accounting."""
        from app.audit import AuditInputError, audit_run

        run_dir = Path(run)
        if not run_dir.is_dir() and (Path("runs") / run).is_dir():
            run_dir = Path("runs") / run

        def progress(line: str) -> None:
            typer.echo(line, err=True)

        try:
            report = audit_run(run_dir, replay=replay, probe=probe, progress=progress)
        except AuditInputError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        if as_json:
            typer.echo(json.dumps(report.to_json()))
        else:
            r, book, acc = report.replay.to_json(), report.ledger.to_json(), report.accounting.to_json()
            typer.echo(f"run {report.run_dir}")
            if r["skipped"]:
                typer.echo(f"replay      not run: {r['skipped']}")
            else:
                typer.echo(
                    f"replay      {r['steps']} steps, max relative difference {r['max_rel_diff']} "
                    f"(tolerance {r['tolerance']:g}); smallest effect of one micro-step doubled or skipped "
                    f"{r['smallest_microstep_effect']}"
                )
            o = report.objective.to_json()
            typer.echo(
                f"objective   {o['executions']} executions of {o['groups']} groups in {o['microsteps']} "
                f"micro-steps recomputed; {o['gradients_compared']} gradients against the audit's objective, "
                f"max relative difference {o['max_gradient_rel_diff']}"
                + (f" (not compared: {o['skipped']})" if o["skipped"] else "")
            )
            for m, c in zip(o["mismatch_by_step"], o["corrections_by_step"], strict=False):
                run = c["variants"]["run"]
                typer.echo(
                    f"step {c['step']:<6} mismatch over {m['tokens']} on-policy targets: mean |Δ log p| "
                    f"{_g(m['mean_abs'])}, max {_g(m['max_abs'])}, k3 KL {_g(m['k3_kl_token_mean'])}; the run's "
                    f"objective: token mask {_g(run['token_mask_fraction'])}, clip {_g(run['clip_fraction'])}, "
                    f"sequence mask {_g(run['sequence_mask_fraction'])} "
                    + (
                        "(the trainer's log not compared)"
                        if c["logged"] is None
                        else "(compared with the trainer's)"
                    )
                )
            typer.echo(
                f"ledger      {book['groups_trained']} groups over {book['steps']} steps; "
                f"matches the report: {book['matches_report']}"
            )
            counts = ", ".join(
                f"{k} {acc[k]}"
                for k in ("trained", "excluded", "placeholder", "cancelled", "unconsumed", "lost")
            )
            typer.echo(
                f"accounting  {acc['dispatched']} dispatched: {counts}; matches the report: {acc['matches_report']}"
            )
            for defect in report.defects:
                typer.echo(f"DEFECT {defect}")
            typer.echo("ok" if report.ok else f"{len(report.defects)} defect(s)")
        raise typer.Exit(0 if report.ok else 1)


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
