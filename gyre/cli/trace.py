"""`gyre trace replay --profile P FILE...`: rebuild a trajectory tree from captured request bodies.

Prints a JSON summary of how a harness session maps into a tree — roots by agent kind, nodes,
leaves by class, unique tokens against tokens if every path were expanded, and the trajectories
and targets admission would take:

    gyre trace replay --profile claude_code session.jsonl
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gyre.trajectory.profiles import PROFILES, get_profile
from gyre.trajectory.replay import load_captures, replay, summarize, summary_json
from gyre.trajectory.templates import make_template

trace_app = typer.Typer(help="Inspect recorded harness traffic.", no_args_is_help=True)


@trace_app.command("replay")
def replay_cmd(
    files: Annotated[
        list[Path], typer.Argument(help="Captured request bodies: JSON, JSON array or JSONL.", exists=True)
    ],
    profile: Annotated[
        str, typer.Option(help=f"Harness profile: {', '.join(sorted(PROFILES))}.")
    ] = "generic",
    template: Annotated[str, typer.Option(help="Chat template that encodes messages.")] = "embedded",
    j_max: Annotated[int, typer.Option("--j-max", min=1, help="Trajectories admission may take.")] = 5,
    seed: Annotated[int, typer.Option(help="Admission seed.")] = 0,
) -> None:
    """Build the tree of a captured session and print its JSON summary."""
    try:
        harness = get_profile(profile)
        calls = load_captures(files)
        tree = replay(calls, make_template(template), harness)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    typer.echo(summary_json(summarize(tree, len(calls), j_max=j_max, seed=seed)))


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
