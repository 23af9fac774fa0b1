"""`gyre sim`: the cluster simulator driven by the scheduler policy.

    gyre sim run --preset nl2repo-122b --mode elastic --steps 12 --plot runs/e0.png
    gyre sim run --preset nl2repo-122b --mode elastic --steps 200 --json
    gyre sim ablation --preset nl2repo-122b --json
    gyre sim presets

With `--json` the last printed line is one JSON object.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

sim_app = typer.Typer(
    help="Discrete-event cluster simulator driven by the scheduler policy.", no_args_is_help=True
)


def _preset(name: str, node_tokens_per_s: float | None = None) -> Any:
    from dataclasses import replace

    from sim.presets import PRESETS

    if name not in PRESETS:
        typer.echo(f"error: unknown preset {name!r}; choose one of: {', '.join(PRESETS)}", err=True)
        raise typer.Exit(2)
    preset = PRESETS[name]
    if node_tokens_per_s is not None:
        if node_tokens_per_s <= 0:
            typer.echo(f"error: --node-tokens-per-s must be > 0; got {node_tokens_per_s}", err=True)
            raise typer.Exit(2)
        preset = replace(preset, training=replace(preset.training, node_tokens_per_s=node_tokens_per_s))
    return preset


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
) -> None:
    """Simulate one configuration: total time, per-step times, staleness, utilization, timeline."""
    from dataclasses import replace

    from services.scheduler.policy import Mode
    from sim.layout import Layout
    from sim.simulation import Simulation

    p = _preset(preset, node_tokens_per_s)
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
            p, layout, steps=steps or p.steps, seed=seed, record_timeline=plot is not None
        )
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    result = simulation.run()
    out = result.to_json()
    if plot is not None and result.timeline is not None:
        from sim.timeline import plot_timeline

        result.timeline.title = (
            f"{p.name} {layout.mode.value} ({layout.describe()}, φ={layout.phi:g}, μ={layout.mu}, "
            f"streaming {'on' if layout.streaming else 'off'}): {result.total_h:.2f} h for {result.steps} steps"
        )
        out["plot"] = str(plot_timeline(result.timeline, plot))
    if as_json:
        typer.echo(json.dumps(out))
        return
    after = out["mean_staleness_after_first_burst"]
    typer.echo(
        f"{p.name} {layout.mode.value} [{layout.describe()}] φ={layout.phi:g} μ={layout.mu} seed={seed}"
    )
    typer.echo(f"total                {result.total_h:.2f} h for {result.steps} steps")
    typer.echo(
        "per step (h)         "
        + " ".join(f"{t:.2f}" for t in result.step_times_h[:48])
        + (" ..." if result.steps > 48 else "")
    )
    typer.echo(
        f"mean staleness       {after} after the first burst, {out['mean_staleness_all_steps']} over all"
        f" steps (φ + (μ−1)/2 = {result.expected_staleness:g})"
    )
    typer.echo(
        f"utilization          rollout {result.rollout_utilization:.1%}, training {result.training_utilization:.1%}"
    )
    typer.echo("cell time            " + ", ".join(f"{k} {v:.1%}" for k, v in result.cell_time_share.items()))
    typer.echo(
        f"executions           {result.executions_finished} simulated ({result.executions_started} started),"
        f" {result.transitions} transitions, {result.reroutes} reroutes, wall {result.wall_s:.2f} s"
    )
    if "plot" in out:
        typer.echo(f"timeline             {out['plot']}")


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
) -> None:
    """Run the paper's Table 2 configurations; print each total, its ratio to E0 and the paper's."""
    from sim.ablation import run_ablation

    p = _preset(preset, node_tokens_per_s)
    started = time.perf_counter()
    try:
        outcomes = run_ablation(p, steps=steps, seed=seed)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    wall_s = time.perf_counter() - started
    fastest = min(outcomes, key=lambda o: o.result.total_s).row.id
    configs = {
        o.row.id: {
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
        for o in outcomes
    }
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "preset": p.name,
                    "steps": steps,
                    "seed": seed,
                    "fastest": fastest,
                    "node_tokens_per_s": p.training.node_tokens_per_s,
                    "configs": configs,
                    "wall_s": round(wall_s, 2),
                }
            )
        )
        return
    typer.echo(
        f"{'id':<4}{'allocation':<16}{'(φ,μ)':<9}{'stream':<8}{'total h':>9}{'vs E0':>8}"
        f"{'paper h':>9}{'paper':>8}  evolution"
    )
    for row_id, c in configs.items():
        typer.echo(
            f"{row_id:<4}{c['allocation']:<16}{'(' + format(c['phi'], 'g') + ',' + str(c['mu']) + ')':<9}"
            f"{'on' if c['streaming'] else 'off':<8}{c['total_h']:>9.2f}{c['ratio_vs_e0']:>8.3f}"
            f"{c['paper_total_h']:>9.2f}{c['paper_ratio_vs_e0']:>8.3f}  {c['evolution']}"
        )
    typer.echo(f"fastest: {fastest}   ({steps} steps, seed {seed}, {wall_s:.1f} s)")


@sim_app.command("presets")
def presets(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line.")] = False,
) -> None:
    """List presets with their workload statistics (sampled) beside the paper's reported ones."""
    from dataclasses import asdict

    from sim.presets import PRESETS
    from sim.workload import workload_statistics

    table: dict[str, Any] = {}
    for p in PRESETS.values():
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


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
