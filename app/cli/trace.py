"""`gyre trace replay --profile P FILE...`: rebuild a trajectory tree from captured request bodies.

Prints a JSON summary of how a harness session maps into a tree — roots by agent kind, nodes,
leaves by class, unique tokens against tokens if every path were expanded, and the trajectories
and targets admission would take:

    gyre trace replay --profile claude_code session.jsonl

It also reads what a run archived when its trained groups left Redis: a run directory, its
`archive/` directory, or archived tree files (`<execution>.tree.gz`), summarized from the recorded
token ids with each tree's stored profile (unless `--profile` is given) and template:

    gyre trace replay runs/local                              # every archived tree of the run
    gyre trace replay runs/local --execution g00003-e05       # one of them
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gyre.model.families import FAMILIES
from gyre.trajectory.profiles import PROFILES, get_profile
from gyre.trajectory.replay import (
    archive_files,
    is_archive_input,
    load_captures,
    replay,
    summarize,
    summarize_archive,
    summary_json,
)
from gyre.trajectory.templates import template_for_family, template_for_model

trace_app = typer.Typer(help="Inspect recorded harness traffic.", no_args_is_help=True)


@trace_app.command("replay")
def replay_cmd(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Captured request bodies (JSON, JSON array or JSONL), or archived trees: a run directory, "
            "its archive/ directory or <execution>.tree.gz files.",
            exists=True,
        ),
    ],
    profile: Annotated[
        str | None,
        typer.Option(
            help=f"Harness profile: {', '.join(sorted(PROFILES))} (captures: generic; archives: stored)."
        ),
    ] = None,
    execution: Annotated[
        str | None, typer.Option(help="Archives only: summarize this execution's tree.")
    ] = None,
    model: Annotated[
        Path | None, typer.Option(help="Model directory whose chat template encodes messages.")
    ] = None,
    family: Annotated[
        str, typer.Option(help=f"Without --model: a chat family ({', '.join(FAMILIES)}), byte tokenizer.")
    ] = "chatml",
    j_max: Annotated[int, typer.Option("--j-max", min=1, help="Trajectories admission may take.")] = 5,
    seed: Annotated[int, typer.Option(help="Admission seed.")] = 0,
) -> None:
    """Build the tree of a captured session (or read archived trees) and print its JSON summary."""
    archives = [is_archive_input(f) for f in files]
    if any(archives):
        try:
            if not all(archives):
                raise ValueError("give either captured request bodies or archived trees, not both")
            stored = get_profile(profile) if profile is not None else None
            summary = summarize_archive(archive_files(files, execution), stored, j_max=j_max, seed=seed)
        except (ValueError, KeyError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
        typer.echo(summary_json(summary))
        return
    try:
        harness = get_profile(profile or "generic")
        calls = load_captures(files)
        template = template_for_model(model) if model is not None else template_for_family(family)
        tree = replay(calls, template, harness)
    except (ValueError, KeyError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    typer.echo(summary_json(summarize(tree, len(calls), j_max=j_max, seed=seed)))


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
