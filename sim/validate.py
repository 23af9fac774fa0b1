"""Validation of the simulator against the real stack: predict each `gyre bench e2e` mode, compare.

    report = validate(bench_e2e_json, seeds=32)      # {"modes": {mode: {measured_s, predicted_s, error, …}}}

For each mode the cell model (sim/local.py) is calibrated from the *other* modes' runs of the same
`gyre bench e2e` result (leave one out), so nothing measured in a mode's own run informs its prediction;
with a single mode it falls back to that run and says so (`in_sample: true`). The simulator then runs
the mode's layout (K cells of one node, the run's φ, μ, ρ_min, τ, C_e, N, B; async with its T fixed
training cells) for the run's steps over `seeds` workload draws. Compared quantity: first dispatch →
last step (`scheduled_s`), the part of a run the simulator models; the bench's whole-run wall time (stack
start, drain, report included) is shown beside it. Executions that failed in a measured run are counted
and warned about: a harness killed part-way (e.g. by another runner using the same sandbox uids) ends
early, which makes that run faster than its workload.

    predicted_s   median over the seeds; predicted_p10_s / _p90_s the spread of the workload draw
    error         (predicted − measured) / measured      goal: |error| ≤ 0.15 per mode
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gyre.config.tasks import TasksSection
from gyre.tasks import TaskSet
from services.scheduler.policy import Mode
from sim.layout import Layout
from sim.local import CellCalibration, ToolSleep, local_preset, percentile
from sim.measured import MeasuredRun, read_run
from sim.simulation import Simulation

GOAL = 0.15
"""|error| the validation aims at, per mode."""
_ORDER_GROUPS = 512
"""Groups of the query order handed to the workload (two of the simulator's 256-group draw blocks)."""


@dataclass(frozen=True, slots=True)
class RunSettings:
    """What the simulator needs of one run's resolved config (runs/<run>/config.yaml)."""

    mode: Mode
    num_cells: int
    cell_capacity: int
    group_size: int
    batch_groups: int
    phi: float
    mu: int
    rho_min: float
    tau_s: float
    async_training_cells: int
    microstep_tokens: int
    tasks: dict[str, Any]
    """The run's `tasks:` section (what it dispatches)."""
    seed: int
    """The scheduler's seed (of the query cycle)."""

    def query_order(self, num_groups: int) -> list[str]:
        """The query of each of the first `num_groups` groups, as the scheduler draws them."""
        cycle = TaskSet.from_section(TasksSection.model_validate(self.tasks)).cycle(self.seed)
        return [cycle.next() for _ in range(num_groups)]

    @property
    def initial_capacity(self) -> int:
        """Executions the cells can run at the start (async's training cells serve none)."""
        training = self.async_training_cells if self.mode is Mode.ASYNC else 0
        return (self.num_cells - training) * self.cell_capacity

    @classmethod
    def read(cls, run_dir: Path) -> RunSettings:
        try:
            config = yaml.safe_load((run_dir / "config.yaml").read_text())
            s, p = config["scheduler"], config["packer"]
            return cls(
                mode=Mode(s["mode"]),
                num_cells=int(s["num_cells"]),
                cell_capacity=int(s["cell_capacity"]),
                group_size=int(s["group_size"]),
                batch_groups=int(s["batch_groups"]),
                phi=float(s["phi"]),
                mu=int(s["mu"]),
                rho_min=float(s["rho_min"]),
                tau_s=float(s["tau_s"]),
                async_training_cells=int(s["async_training_cells"]),
                microstep_tokens=int(p["microstep_tokens"]),
                tasks=dict(config.get("tasks") or {}),
                seed=int(s.get("seed", 0)),
            )
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{run_dir}/config.yaml: cannot read the run's settings ({e})") from None


def predict(calibration: CellCalibration, settings: RunSettings, *, steps: int, seeds: int) -> list[float]:
    """Simulated seconds to `steps` steps for each workload seed."""
    preset = local_preset(
        calibration,
        num_cells=settings.num_cells,
        cell_capacity=settings.cell_capacity,
        group_size=settings.group_size,
        batch_groups=settings.batch_groups,
        rho_min=settings.rho_min,
        tau_s=settings.tau_s,
        microstep_tokens=settings.microstep_tokens,
        steps=steps,
        query_order=settings.query_order(_ORDER_GROUPS),
    )
    layout = Layout(
        settings.mode,
        num_cells=settings.num_cells,
        cell_nodes=1,
        phi=settings.phi,
        mu=settings.mu,
        streaming=True,
        async_training_cells=settings.async_training_cells if settings.mode is Mode.ASYNC else 0,
    )
    return [Simulation(preset, layout, steps=steps, seed=seed).run().total_s for seed in range(seeds)]


def validate(measured: dict[str, Any], *, seeds: int = 32) -> dict[str, Any]:
    """Predicted vs measured per mode of a `gyre bench e2e --json` result (its `runs` and `tool_latency`)."""
    if "runs" not in measured or "tool_latency" not in measured:
        raise ValueError(
            "not a gyre bench e2e result with run directories (it needs `runs` and `tool_latency`)"
        )
    steps = int(measured["steps"])
    latency = measured["tool_latency"]
    tool_sleep = ToolSleep(
        float(latency["median_s"]), float(latency.get("alpha", 1.5)), float(latency["max_s"])
    )
    runs: dict[str, MeasuredRun] = {}
    settings: dict[str, RunSettings] = {}
    for mode, entry in measured["runs"].items():
        run_dir = Path(entry["run_dir"])
        runs[mode], settings[mode] = read_run(run_dir), RunSettings.read(run_dir)
    modes: dict[str, Any] = {}
    for mode, run in runs.items():
        sources = [m for m in runs if m != mode] or [mode]
        calibration = CellCalibration.from_runs(
            [runs[m] for m in sources], tool_sleep, [settings[m].initial_capacity for m in sources]
        )
        totals = predict(calibration, settings[mode], steps=steps, seeds=seeds)
        measured_s = run.scheduled_s(steps)
        if measured_s is None:
            raise ValueError(f"{run.run_dir}: fewer than {steps} completed steps")
        predicted_s = statistics.median(totals)
        s = settings[mode]
        modes[mode] = {
            "measured_s": round(measured_s, 1),
            "predicted_s": round(predicted_s, 1),
            "error": round((predicted_s - measured_s) / measured_s, 3),
            "within_goal": abs(predicted_s - measured_s) <= GOAL * measured_s,
            "predicted_p10_s": round(percentile(totals, 0.1), 1),
            "predicted_p90_s": round(percentile(totals, 0.9), 1),
            "measured_wall_s": measured["runs"][mode].get("wall_s"),
            "phi": s.phi,
            "mu": s.mu,
            "measured_failed_executions": run.failed,
            "in_sample": sources == [mode],
            "calibration": calibration.figures(),
        }
    failed = {m: v["measured_failed_executions"] for m, v in modes.items() if v["measured_failed_executions"]}
    out: dict[str, Any] = {
        "modes": modes,
        "warnings": [
            f"{m}: {n} executions failed (killed from outside? a run whose executions end early is "
            "faster than its workload)"
            for m, n in failed.items()
        ],
        "max_abs_error": max(abs(m["error"]) for m in modes.values()),
        "goal_abs_error": GOAL,
        "steps": steps,
        "seeds": seeds,
        "compared": "first dispatch -> last step (scheduled_s), the part of a run the simulator models",
    }
    if "elastic" in modes:
        for other in ("async", "colocate"):
            if other in modes:
                out[f"speedup_vs_{other}"] = {
                    "measured": round(modes[other]["measured_s"] / modes["elastic"]["measured_s"], 3),
                    "predicted": round(modes[other]["predicted_s"] / modes["elastic"]["predicted_s"], 3),
                }
    return out
