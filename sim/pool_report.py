"""`gyre sim run --pool NAME`: elastic on a changing pool against the paper's fixed pool and the baselines.

    report = compare_pools(preset, POOLS["spot"], steps=12, seed=0, elastic=Layout.default(preset, ELASTIC))

Each run does the same number of optimizer steps on the same workload draw (one seed). Pools differ in
size over time, so runs are compared at equal capacity-hours: capacity-hours = ∫ (nodes in the pool) dt
over the run, a cell counting from joining the pool until it is gone, whatever it does. The figure
compared is throughput per capacity-hour — steps per 1,000 node-hours — and `speedup_per_capacity_hour`
is elastic's over each other run's; `speedup_time_to_finish` (the other's hours over elastic's) is beside
it, for the same steps.

    elastic                 the layout asked for, on the scenario's pool (Gyre: joins, notices, losses in place)
    elastic_fixed_pool      the paper's elastic on the preset's fixed pool
    async, colocate         the paper's baselines, (φ, μ) matched at E[d] = 1.5, on the scenario's pool with the
                            same pool events through the same policy; being static jobs, each restarts after a
                            lost cell (PoolScenario.restart_s)
    async_fixed_pool, colocate_fixed_pool     the baselines on the fixed pool, for reference
    async_no_restart, colocate_no_restart     (scenarios that lose cells) the baselines handling losses in place
                            like elastic (restart_s = 0): how much of the gap the restart assumption makes
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from services.scheduler.policy import Mode
from sim.layout import Layout
from sim.metrics import SimResult
from sim.pool import POOLS, PoolScenario
from sim.presets import Preset
from sim.simulation import Simulation


def run_entry(result: SimResult, restart_s: float | None) -> dict[str, Any]:
    """One run of the comparison, as the report shows it."""
    pool = result.pool.to_json(result.steps, result.total_s)
    return {
        "mode": result.mode,
        "layout": result.layout,
        "phi": result.phi,
        "mu": result.mu,
        "pool": pool.pop("scenario"),
        "restart_s": restart_s,
        "total_h": round(result.total_h, 3),
        **pool,
        "mean_staleness_all_steps": round(result.mean_staleness() or 0.0, 4),
    }


def compare_pools(
    preset: Preset,
    scenario: PoolScenario,
    *,
    steps: int,
    seed: int,
    elastic: Layout,
    elastic_result: SimResult | None = None,
) -> dict[str, Any]:
    """Every run above; `elastic_result` is reused for the first when it was already simulated."""

    def simulate(layout: Layout, pool: PoolScenario) -> SimResult:
        return Simulation(preset, layout, steps=steps, seed=seed, pool=pool).run()

    fixed = POOLS["fixed"]
    runs: dict[str, dict[str, Any]] = {
        "elastic": run_entry(elastic_result or simulate(elastic, scenario), None),
        "elastic_fixed_pool": run_entry(simulate(elastic, fixed), None),
    }
    loses_cells = scenario.failures_per_node_h > 0 or scenario.reclaims_per_cell_h > 0
    for mode in (Mode.ASYNC, Mode.COLOCATE):
        layout = Layout.default(preset, mode)
        runs[mode.value] = run_entry(simulate(layout, scenario), scenario.restart_s)
        runs[f"{mode.value}_fixed_pool"] = run_entry(simulate(layout, fixed), scenario.restart_s)
        if loses_cells and scenario.restart_s > 0:
            runs[f"{mode.value}_no_restart"] = run_entry(
                simulate(layout, replace(scenario, restart_s=0.0)), 0.0
            )
    ours = runs["elastic"]
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "parameters": scenario.parameters(),
        "steps": steps,
        "seed": seed,
        "capacity_hours": "integral of the pool's size (nodes) over the run's wall time: a cell counts from "
        "joining the pool until it is gone, whatever it does",
        "compared": "throughput per capacity-hour (steps per 1,000 node-hours) for the same steps; "
        "speedup_per_capacity_hour = elastic's / the other's, speedup_time_to_finish = the other's hours / elastic's",
        "runs": runs,
        "speedup_per_capacity_hour": {
            name: round(ours["steps_per_1k_node_h"] / run["steps_per_1k_node_h"], 3)
            for name, run in runs.items()
            if name != "elastic"
        },
        "speedup_time_to_finish": {
            name: round(run["total_h"] / ours["total_h"], 3)
            for name, run in runs.items()
            if name != "elastic"
        },
        "regime": "cluster scale: the paper's preset in the simulator (not a measurement); every pool figure "
        "is assumed (sim/pool.py)",
    }


def report_lines(report: dict[str, Any]) -> list[str]:
    """The comparison as a table (without --json)."""
    lines = [
        f"pool {report['scenario']}: {report['description']} ({report['steps']} steps, seed {report['seed']})",
        f"{'run':<22}{'total h':>9}{'node-h':>9}{'steps/1k node-h':>17}{'joined':>8}{'left':>6}{'lost':>6}"
        f"{'steps lost':>12}{'restarts':>10}{'speedup':>9}",
    ]
    for name, run in report["runs"].items():
        speedup = report["speedup_per_capacity_hour"].get(name)
        lines.append(
            f"{name:<22}{run['total_h']:>9.2f}{run['capacity_node_h']:>9.0f}{run['steps_per_1k_node_h']:>17.2f}"
            f"{run['cells_joined']:>8}{run['cells_left']:>6}{run['cells_lost']:>6}{run['steps_lost']:>12}"
            f"{run['restarts']:>10}{'' if speedup is None else format(speedup, '.3f'):>9}"
        )
    lines.append("speedup: elastic's steps per capacity-hour over each run's; " + report["regime"])
    return lines
