"""`gyre sim`: the cluster simulator driven by the scheduler policy.

    gyre sim run --preset nl2repo-122b --mode elastic --steps 12 --plot runs/e0.png
    gyre sim run --preset nl2repo-122b --mode elastic --steps 200 --json
    gyre sim run --preset paper --pool spot --json        # a changing pool: elastic vs fixed pool and baselines
    gyre sim ablation --preset nl2repo-122b --json
    gyre sim presets
    gyre sim validate --measured runs/e2e.json --json     # predicted vs measured per mode of gyre bench e2e

With `--json` the last printed line is one JSON object. The `gyre` command loads this module as the entry
point `sim` of the group `gyre.commands` (pyproject.toml); `validate` without `--measured` runs
`gyre bench e2e --json` as a command of its own, so the simulator imports no benchmark.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

sim_app = typer.Typer(
    help="Discrete-event cluster simulator driven by the scheduler policy.", no_args_is_help=True
)


def _preset(name: str, node_tokens_per_s: float | None = None) -> Any:
    from dataclasses import replace

    from sim.presets import PRESET_ALIASES, PRESETS

    name = PRESET_ALIASES.get(name, name)
    if name not in PRESETS:
        choices = ", ".join([*PRESETS, *PRESET_ALIASES])
        typer.echo(f"error: unknown preset {name!r}; choose one of: {choices}", err=True)
        raise typer.Exit(2)
    preset = PRESETS[name]
    if node_tokens_per_s is not None:
        if node_tokens_per_s <= 0:
            typer.echo(f"error: --node-tokens-per-s must be > 0; got {node_tokens_per_s}", err=True)
            raise typer.Exit(2)
        preset = replace(preset, training=replace(preset.training, node_tokens_per_s=node_tokens_per_s))
    return preset


def _pool(name: str | None, restart_s: float | None) -> Any:
    """The pool scenario `--pool` names (None: none asked for), with `--restart-s` applied."""
    from dataclasses import replace

    from sim.pool import POOLS

    if name is None:
        if restart_s is not None:
            typer.echo("error: --restart-s needs --pool (it is a pool scenario's cost)", err=True)
            raise typer.Exit(2)
        return None
    if name not in POOLS:
        typer.echo(f"error: unknown pool scenario {name!r}; choose one of: {', '.join(POOLS)}", err=True)
        raise typer.Exit(2)
    if restart_s is not None and restart_s < 0:
        typer.echo(f"error: --restart-s must be >= 0; got {restart_s}", err=True)
        raise typer.Exit(2)
    return POOLS[name] if restart_s is None else replace(POOLS[name], restart_s=restart_s)


_POOL_HELP = (
    "Pool scenario: fixed, spot, failures or grow (sim/pool.py). The run uses it, and the report adds the "
    "elastic run against the paper's fixed pool and the async and colocate baselines at equal capacity-hours."
)

_THROUGHPUT_HELP = (
    "Override the preset's training throughput (trained tokens/s per node): its least certain number."
)


@sim_app.command("run")
def run(
    preset: Annotated[str, typer.Option("--preset", help="Cluster and workload preset.")] = "nl2repo-122b",
    mode: Annotated[str, typer.Option("--mode", help="elastic, async or colocate.")] = "elastic",
    phi: Annotated[float | None, typer.Option("--phi", help="φ; default per mode (E[d] = 1.5).")] = None,
    mu: Annotated[int | None, typer.Option("--mu", help="μ; default per mode (E[d] = 1.5).")] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", help="Optimizer steps to simulate; default: the paper's.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Workload seed.")] = 0,
    streaming: Annotated[bool, typer.Option("--streaming/--no-streaming", help="Streaming training.")] = True,
    cells: Annotated[int | None, typer.Option("--cells", help="K; default: the preset's.")] = None,
    cell_nodes: Annotated[
        int | None, typer.Option("--cell-nodes", help="Nodes per cell; default: the preset's.")
    ] = None,
    pool_nodes: Annotated[int, typer.Option("--pool-nodes", help="Nodes of a separate rollout pool.")] = 0,
    training_cells: Annotated[
        int | None, typer.Option("--training-cells", help="T in async mode; default K/2.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the role timeline PNG here.")] = None,
    node_tokens_per_s: Annotated[
        float | None, typer.Option("--node-tokens-per-s", help=_THROUGHPUT_HELP)
    ] = None,
    pool: Annotated[str | None, typer.Option("--pool", help=_POOL_HELP)] = None,
    restart_s: Annotated[
        float | None,
        typer.Option("--restart-s", help="Override the scenario's restart cost of a static baseline (s)."),
    ] = None,
) -> None:
    """Simulate one configuration: total time, per-step times, staleness, utilization, timeline."""
    from dataclasses import replace

    from services.scheduler.policy import Mode
    from sim.layout import Layout
    from sim.simulation import Simulation

    p = _preset(preset, node_tokens_per_s)
    scenario = _pool(pool, restart_s)
    try:
        layout = Layout.default(p, Mode(mode), phi=phi, mu=mu, streaming=streaming)
        if cells is not None or cell_nodes is not None or pool_nodes or training_cells is not None:
            layout = replace(
                layout,
                num_cells=cells if cells is not None else layout.num_cells,
                cell_nodes=cell_nodes if cell_nodes is not None else layout.cell_nodes,
                separate_pool_nodes=pool_nodes,
                async_training_cells=training_cells
                if training_cells is not None
                else layout.async_training_cells,
            )
        simulation = Simulation(
            p, layout, steps=steps or p.steps, seed=seed, record_timeline=plot is not None, pool=scenario
        )
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    result = simulation.run()
    out = result.to_json()
    if plot is not None and result.timeline is not None:
        from gyre.metrics.timeline import plot_timeline

        result.timeline.title = (
            f"{p.name} {layout.mode.value} ({layout.describe()}, φ={layout.phi:g}, μ={layout.mu}, "
            f"streaming {'on' if layout.streaming else 'off'}): {result.total_h:.2f} h for {result.steps} steps"
        )
        out["plot"] = str(plot_timeline(result.timeline, plot))
    if scenario is not None:
        from sim.pool_report import compare_pools, report_lines

        elastic = layout if layout.mode is Mode.ELASTIC else Layout.default(p, Mode.ELASTIC)
        out["pool_comparison"] = compare_pools(
            p,
            scenario,
            steps=result.steps,
            seed=seed,
            elastic=elastic,
            elastic_result=result if layout.mode is Mode.ELASTIC else None,
        )
    if as_json:
        typer.echo(json.dumps(out))
        return
    title = f"{p.name} {layout.mode.value} [{layout.describe()}] φ={layout.phi:g} μ={layout.mu} seed={seed}"
    for line in result.text_lines(title):
        typer.echo(line)
    if "plot" in out:
        typer.echo(f"timeline             {out['plot']}")
    if "pool_comparison" in out:
        for line in report_lines(out["pool_comparison"]):
            typer.echo(line)


@sim_app.command("ablation")
def ablation(
    preset: Annotated[
        str, typer.Option("--preset", help="Preset (Table 2 is for nl2repo-122b).")
    ] = "nl2repo-122b",
    steps: Annotated[
        int, typer.Option("--steps", help="Steps per configuration (the paper's table: 12).")
    ] = 12,
    seed: Annotated[int, typer.Option("--seed", help="Workload seed, shared by all configurations.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line.")] = False,
    node_tokens_per_s: Annotated[
        float | None, typer.Option("--node-tokens-per-s", help=_THROUGHPUT_HELP)
    ] = None,
    validation: Annotated[
        Path | None,
        typer.Option(
            "--validation", help="A saved `gyre sim validate --json` output to disclose beside the table."
        ),
    ] = None,
) -> None:
    """Run the paper's Table 2 configurations; print each total, its ratio to E0 and the paper's.

    The output discloses every figure of the preset with its source (paper, fitted to the paper's
    workload statistics, assumed) and, with --validation, how the simulator fared against this machine."""
    from sim.ablation import run_ablation
    from sim.presets import figure_sources

    validated = _validation_summary(validation) if validation is not None else None
    p = _preset(preset, node_tokens_per_s)
    sources = figure_sources(p)
    if node_tokens_per_s is not None:
        sources["training.node_tokens_per_s"] = {"value": node_tokens_per_s, "source": "--node-tokens-per-s"}
    started = time.perf_counter()
    try:
        outcomes = run_ablation(p, steps=steps, seed=seed)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    wall_s = time.perf_counter() - started
    report = {
        "preset": p.name,
        "steps": steps,
        "seed": seed,
        "fastest": min(outcomes, key=lambda o: o.result.total_s).row.id,
        "node_tokens_per_s": p.training.node_tokens_per_s,
        "configs": {o.row.id: _ablation_config(o) for o in outcomes},
        "wall_s": round(wall_s, 2),
        "regime": "cluster scale: the paper's preset in the simulator (not a measurement)",
        "calibration": sources,
        "validation": validated,
    }
    if as_json:
        typer.echo(json.dumps(report))
        return
    for line in _ablation_text(report):
        typer.echo(line)


def _ablation_config(o: Any) -> dict[str, Any]:
    """One configuration of the ablation table (an `AblationOutcome`) as the report shows it."""
    return {
        "evolution": o.row.evolution,
        "mode": o.row.layout.mode.value,
        "allocation": o.row.layout.describe(),
        "phi": o.row.layout.phi,
        "mu": o.row.layout.mu,
        "streaming": o.row.layout.streaming,
        "total_h": round(o.result.total_h, 3),
        "ratio_vs_e0": round(o.ratio_vs_e0, 3),
        "paper_total_h": o.row.paper_total_h,
        "paper_ratio_vs_e0": o.row.paper_ratio_vs_e0,
        "mean_staleness_all_steps": round(o.result.mean_staleness() or 0.0, 3),
        "rollout_utilization": round(o.result.rollout_utilization, 3),
        "training_utilization": round(o.result.training_utilization, 3),
    }


def _ablation_text(report: dict[str, Any]) -> list[str]:
    """The ablation report as a table, its calibration and its validation (without --json)."""
    lines = [
        f"{'id':<4}{'allocation':<16}{'(φ,μ)':<9}{'stream':<8}{'total h':>9}{'vs E0':>8}"
        f"{'paper h':>9}{'paper':>8}  evolution"
    ]
    for row_id, c in report["configs"].items():
        lines.append(
            f"{row_id:<4}{c['allocation']:<16}{'(' + format(c['phi'], 'g') + ',' + str(c['mu']) + ')':<9}"
            f"{'on' if c['streaming'] else 'off':<8}{c['total_h']:>9.2f}{c['ratio_vs_e0']:>8.3f}"
            f"{c['paper_total_h']:>9.2f}{c['paper_ratio_vs_e0']:>8.3f}  {c['evolution']}"
        )
    lines += [
        f"fastest: {report['fastest']}   ({report['steps']} steps, seed {report['seed']}, {report['wall_s']:.1f} s)",
        "regime: cluster scale, the paper's preset in the simulator (not a measurement)",
        f"calibration of {report['preset']} (paper = reported by the paper; fitted = to its reported workload "
        "statistics, never to speedups; assumed = not reported):",
    ]
    for name, f in report["calibration"].items():
        note = f"  ({f['note']})" if "note" in f else ""
        lines.append(f"  {name:<36}{f['value']!s:>12}  {f['source']}{note}")
    validated = report["validation"]
    if validated is not None:
        errors = ", ".join(f"{m} {e:+.1%}" for m, e in validated["errors"].items())
        lines.append(f"validation: {validated['summary']}: {errors}")
    else:
        lines.append(
            "validation: the simulator's mechanics are checked against the real stack by `gyre sim validate` "
            "(--validation FILE shows its result here)"
        )
    return lines


def _validation_summary(path: Path) -> dict[str, Any]:
    """What a saved `gyre sim validate --json` output says, for the ablation's disclosure."""
    report = _last_json(path)
    if "modes" not in report:
        typer.echo(f"error: --validation {path}: not a `gyre sim validate --json` output", err=True)
        raise typer.Exit(2)
    errors = {m: v["error"] for m, v in report["modes"].items()}
    goal = report.get("goal_abs_error", 0.15)
    met = all(abs(e) <= goal for e in errors.values())
    return {
        "file": str(path),
        "errors": errors,
        "max_abs_error": report.get("max_abs_error"),
        "goal_abs_error": goal,
        "summary": (
            f"the simulator, calibrated on this machine's CPU stack, predicted its {len(errors)} modes "
            f"{'within' if met else 'NOT all within'} ±{goal:.0%} (first dispatch → last step)"
        ),
        "note": "that validates the simulator's mechanics (policy, workload, packing, training, transitions); "
        "the cluster figures above are the preset's, not this machine's",
    }


@sim_app.command("presets")
def presets(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line.")] = False,
) -> None:
    """List presets with their workload statistics (sampled) beside the paper's reported ones."""
    from dataclasses import asdict

    from sim.presets import PRESETS
    from sim.workload import WorkloadModel, workload_statistics

    table: dict[str, Any] = {}
    for p in PRESETS.values():
        assert isinstance(p.workload, WorkloadModel), "every listed preset has a statistical workload"
        stats = asdict(workload_statistics(p.workload, p.group_size, num_groups=20_000, seed=0))
        table[p.name] = {
            "description": p.description,
            "sampled": {k: round(v, 4) for k, v in stats.items()},
            "reported": dict(p.calibration_targets),
        }
    if as_json:
        typer.echo(json.dumps(table))
        return
    for name, entry in table.items():
        typer.echo(f"{name}: {entry['description']}")
        for key, value in entry["sampled"].items():
            reported = entry["reported"].get(key)
            typer.echo(
                f"  {key:<30}{value:>8.4f}" + (f"   reported {reported:.4f}" if reported is not None else "")
            )


def _last_json(path: Path) -> dict[str, Any]:
    """The last line of `path` that is a JSON object (a saved `gyre bench e2e --json` output)."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip().startswith("{")]
        value = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError) as e:
        typer.echo(f"error: --measured {path}: {e}", err=True)
        raise typer.Exit(2) from None
    if not isinstance(value, dict):
        typer.echo(
            f"error: --measured {path}: no JSON object line (save `gyre bench e2e --json` there)", err=True
        )
        raise typer.Exit(2)
    return value


def _relative_to(result: dict[str, Any], base: Path) -> dict[str, Any]:
    """A saved result whose run directories are relative and not found from here is read from `base` (the
    saved file's directory), so a result kept with its runs (tests/fixtures/sim_e2e) validates from anywhere."""
    runs = result.get("runs")
    if not isinstance(runs, dict):
        return result
    for entry in runs.values():
        path = Path(str(entry.get("run_dir", ""))) if isinstance(entry, dict) else None
        if path is not None and not path.is_absolute() and not path.exists() and (base / path).exists():
            entry["run_dir"] = str(base / path)
    return result


def _bench_e2e(argv: list[str]) -> dict[str, Any]:
    """`gyre bench e2e --json ARGV` run now: its JSON line (its progress goes to this stderr)."""
    command = [sys.executable, "-c", "from app.cli import main; main()", "bench", "e2e", "--json", *argv]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.strip().startswith("{")]
    if done.returncode != 0 or not lines:
        typer.echo(f"error: gyre bench e2e exited {done.returncode} without its JSON line", err=True)
        raise typer.Exit(2)
    value: dict[str, Any] = json.loads(lines[-1])
    return value


@sim_app.command("validate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def validate(
    ctx: typer.Context,
    measured: Annotated[
        Path | None,
        typer.Option("--measured", help="A saved `gyre bench e2e --json` result (default: run it now)."),
    ] = None,
    save: Annotated[
        Path | None, typer.Option("--save", help="Write the bench e2e result measured now here.")
    ] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="Workload draws per mode.")] = 32,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line.")] = False,
) -> None:
    """Predict each mode of `gyre bench e2e` with the simulator calibrated on this machine; compare.

    Extra arguments are passed to `gyre bench e2e` when it runs now (e.g. `--steps 6`)."""
    from sim.validate import validate as run_validation

    if seeds < 1:
        typer.echo(f"error: --seeds must be >= 1; got {seeds}", err=True)
        raise typer.Exit(2)
    if measured is not None:
        result = _relative_to(_last_json(measured), measured.parent)
    else:
        result = _bench_e2e(list(ctx.args))
        if save is not None:
            save.parent.mkdir(parents=True, exist_ok=True)
            save.write_text(json.dumps(result) + "\n")
    try:
        report = run_validation(result, seeds=seeds)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    report["regime"] = (
        "CPU stack (this machine, K cells sharing its cores): measured runs and the simulator calibrated"
        " on them; not cluster results (gyre sim ablation gives those from the paper's presets)"
    )
    if as_json:
        typer.echo(json.dumps(report))
        return
    typer.echo(
        f"{'mode':<10}{'(φ,μ)':<10}{'measured s':>11}{'predicted s':>12}{'p10-p90 s':>15}{'error':>8}  goal"
    )
    for mode, m in report["modes"].items():
        band = f"{m['predicted_p10_s']:.0f}-{m['predicted_p90_s']:.0f}"
        typer.echo(
            f"{mode:<10}{'(' + format(m['phi'], 'g') + ',' + str(m['mu']) + ')':<10}{m['measured_s']:>11.1f}"
            f"{m['predicted_s']:>12.1f}{band:>15}{m['error']:>+8.1%}  {'ok' if m['within_goal'] else 'MISSED'}"
        )
    typer.echo(f"compared: {report['compared']}; {report['seeds']} workload draws per mode")
    for warning in report["warnings"]:
        typer.echo(f"warning: {warning}")
    for mode, m in report["modes"].items():
        cal = {k: v for k, v in m["calibration"].items() if k != "source_runs"}
        typer.echo(
            f"calibration for {mode} (from {', '.join(Path(r).name for r in m['calibration']['source_runs'])}):"
        )
        typer.echo("  " + json.dumps(cal))
    typer.echo(report["regime"])


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
