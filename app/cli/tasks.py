"""`gyre tasks check`, `gyre tasks list` and `gyre tasks build`: validate task directories, show what a
config dispatches, build the tasks' images ahead of a run.

    gyre tasks check examples/tasks             # a set, one task directory, or a JSONL dataset
    gyre tasks list --config gyre.yaml [--json]  # suite, id, weight, share, format, source
    gyre tasks build examples/tasks [--config gyre.yaml] [--force]

`check` prints every problem as `error: PATH: what` or `warning: PATH: what` (a key is named as
`[table] key`) and exits 1 when there is an error; warnings (what the local sandbox cannot reproduce)
do not fail it. `list` exits 1 naming the file and key when the config's task set cannot be loaded.
`build` builds each task's `environment/Dockerfile` with the engine of the config's
`runner.sandbox.container` (what the `container` launcher would do at a task's first execution: tagged by
the environment's digest, so an unchanged task is built once per host), logs in `<run dir>/builds`; it
prints one line per task and exits 1 when a build fails, 2 when no engine answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from app.cli._config import config_or_exit


def _check(path: Path) -> tuple[int, list[str], int]:
    """(tasks checked, problem lines, errors) for one argument."""
    from gyre.tasks import Problems, TaskError
    from gyre.tasks.dataset import read_dataset
    from gyre.tasks.directory import DirectorySuite

    problems = Problems()
    suites: list[DirectorySuite] = []
    if path.is_file() and path.suffix == ".jsonl":
        suites += [
            DirectorySuite(e.directory) for e in read_dataset(path, problems) if e.directory is not None
        ]
    elif path.is_dir():
        try:
            suites.append(DirectorySuite(path))
        except TaskError as e:
            problems.error(path, str(e))
    else:
        problems.error(path, "not a task directory, a set of them or a .jsonl dataset")
    checked = 0
    for suite in suites:
        problems += suite.check()
        checked += len(suite.names())
    return checked, [f"{p.severity}: {p}" for p in problems], len(problems.errors)


tasks_app = typer.Typer(
    help="Task directories (Harbor, task.yaml), datasets and what a run dispatches.", no_args_is_help=True
)


@tasks_app.command("check")
def check_cmd(
    paths: list[Path] = typer.Argument(..., help="Task directories, sets of them, or JSONL datasets."),
) -> None:
    """Validate tasks; name every problem with its path; exit 1 on any error."""
    total, errors, warnings = 0, 0, 0
    for path in paths:
        checked, lines, num_errors = _check(path)
        for line in lines:
            typer.echo(line)
        total += checked
        errors += num_errors
        warnings += sum(line.startswith("warning") for line in lines)
    typer.echo(f"{total} task(s) checked: {errors} error(s), {warnings} warning(s)")
    if errors:
        raise typer.Exit(1)


@tasks_app.command("build")
def build_cmd(
    paths: list[Path] = typer.Argument(..., help="Task directories or sets of them."),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML config file (its runner.sandbox.container and run dir)."
    ),
    force: bool = typer.Option(False, "--force", help="Build again through the engine's layer cache."),
) -> None:
    """Build the tasks' images (environment/Dockerfile); exit 1 if one fails."""
    import asyncio

    from gyre.sandbox import EnvironmentUnavailableError
    from gyre.sandbox.containers.images import Images
    from gyre.tasks import Task, TaskError
    from gyre.tasks.directory import DirectorySuite

    cfg = config_or_exit(config)
    tasks: list[Task] = []
    try:
        for path in paths:
            suite = DirectorySuite(path)
            tasks += [suite.get(name) for name in suite.names()]
    except TaskError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    try:
        images = Images.of_engine(cfg.runner.sandbox, cfg.run.path / "builds")
    except EnvironmentUnavailableError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None

    failed = asyncio.run(_build_all(images, tasks, force))
    typer.echo(f"{len(tasks)} task(s): {failed} failed")
    if failed:
        raise typer.Exit(1)


@tasks_app.command("list")
def list_cmd(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML config file (its `tasks:` section)."
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: the queries."),
) -> None:
    """What the config would dispatch: suite, id, weight, share of draws, format, source."""
    from gyre.tasks import TaskError, TaskSet

    cfg = config_or_exit(config)
    try:
        task_set = TaskSet.from_section(cfg.tasks)
    except TaskError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    total = sum(q.weight for q in task_set.queries)
    rows: list[dict[str, Any]] = []
    for q in task_set.queries:
        task = task_set.registry.get(q.task_id)
        rows.append(
            {
                "suite": q.task_id.partition("/")[0],
                "task": q.task_id,
                "weight": q.weight,
                "share": q.weight / total if total else 0.0,
                "format": task.source,
                "source": q.source,
            }
        )
    if as_json:
        typer.echo(json.dumps({"queries": rows, "warnings": task_set.warnings}))
        return
    for line in _table(rows):
        typer.echo(line)
    for w in task_set.warnings:
        typer.echo(f"warning: {w}", err=True)


async def _build_all(images: Any, tasks: list[Any], force: bool) -> int:
    """Build each task's image (or say which default image it runs in); the number that failed."""
    from gyre.sandbox import EnvironmentUnavailableError

    failed = 0
    for task in tasks:
        if not images.holds_workspace(task) and not task.environment.docker_image:
            typer.echo(f"{task.task_id}: no environment/Dockerfile; runs in {images.default_image}")
            continue
        try:
            result = await images.build(task, force=force)
        except EnvironmentUnavailableError as e:
            typer.echo(f"error: {e}", err=True)
            failed += 1
            continue
        how = "cached" if result.cached else f"built in {result.seconds:.1f} s (log {result.log})"
        typer.echo(f"{task.task_id}: {result.image} {how}")
    return failed


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """`gyre tasks list` without --json: a column per field, then the totals."""
    width = max([len(r["task"]) for r in rows] + [2])
    suite_w = max([len(r["suite"]) for r in rows] + [5])
    lines = [f"{'suite':<{suite_w}}  {'id':<{width}}  {'weight':>6}  {'share':>6}  {'format':<9}  source"]
    lines += [
        f"{r['suite']:<{suite_w}}  {r['task']:<{width}}  {r['weight']:>6g}  {r['share']:>6.1%}  "
        f"{r['format']:<9}  {r['source']}"
        for r in rows
    ]
    lines.append(f"{len(rows)} task(s) in {len({r['suite'] for r in rows})} suite(s)")
    return lines


def register(app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
