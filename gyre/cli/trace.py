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

from gyre.model.families import FAMILIES
from gyre.trajectory.profiles import PROFILES, get_profile
from gyre.trajectory.replay import load_captures, replay, summarize, summary_json
from gyre.trajectory.templates import template_for_family, template_for_model

trace_app = typer.Typer(help="Inspect recorded harness traffic.", no_args_is_help=True)


@trace_app.command("replay")
def replay_cmd(
    files: Annotated[
        list[Path], typer.Argument(help="Captured request bodies: JSON, JSON array or JSONL.", exists=True)
    ],
    profile: Annotated[
        str, typer.Option(help=f"Harness profile: {', '.join(sorted(PROFILES))}.")
    ] = "generic",
    model: Annotated[
        Path | None, typer.Option(help="Model directory whose chat template encodes messages.")
    ] = None,
    family: Annotated[
        str, typer.Option(help=f"Without --model: a chat family ({', '.join(FAMILIES)}), byte tokenizer.")
    ] = "chatml",
    j_max: Annotated[int, typer.Option("--j-max", min=1, help="Trajectories admission may take.")] = 5,
    seed: Annotated[int, typer.Option(help="Admission seed.")] = 0,
) -> None:
    """Build the tree of a captured session and print its JSON summary."""
    try:
        harness = get_profile(profile)
        calls = load_captures(files)
        template = template_for_model(model) if model is not None else template_for_family(family)
        tree = replay(calls, template, harness)
    except (ValueError, KeyError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    typer.echo(summary_json(summarize(tree, len(calls), j_max=j_max, seed=seed)))


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
