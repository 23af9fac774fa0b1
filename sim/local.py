"""The simulator's cell model for this machine's CPU stack, calibrated from what the real stack measured.

Nothing here comes from the paper. `CellCalibration.from_runs(runs, tool_sleep)` takes measured runs
(sim/measured.py) and keeps, as the cell model:

    executions  per suite, each execution's *busy* time (its duration minus its tool sleeps: sandbox
                start, model calls through the proxy and the embedded engine's decode, tools) with its
                number of tool calls, and its evaluation latency — resampled whole (bootstrap)
    tool sleeps the harness's own draws (Pareto, median, cap: the run's harness arguments): the demo
                harness seeds them with its execution id, so execution g00007-e03's k-th tool call
                sleeps the same in every run; the simulator draws exactly those (`harness_sleep_s`),
                one per tool call, rather than reading the slept seconds any run recorded
    training    one cell's throughput (trained tokens / forward-backward seconds of every micro-step),
                trained tokens per execution, the step overhead (last micro-step → step completed)
    switches    median rollout → training and training → rollout transition times, publication time
    runner      seconds per start while it has a backlog (it takes executions one at a time): the
                initial ramp of each run, when the first dispatch queues more than the cells hold

`local_preset(calibration, …)` is a simulator preset of the stack (K cells of one node, C_e executions
each, N, B, ρ_min, τ, the packer's micro-step budget, all from the run's config), whose workload
(`MeasuredWorkload`) follows the run's query order and execution ids. sim/validate.py predicts each
mode with it.
"""

from __future__ import annotations

import math
import random
import statistics
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gyre.ids import execution_id, group_id
from sim.measured import MeasuredRun, median_or
from sim.presets import Preset
from sim.training import TrainingModel
from sim.workload import COMPLETED, GroupBlock


@dataclass(frozen=True, slots=True)
class ToolSleep:
    """The demo harness's tool latency (harness/latency.py): Pareto(alpha) scaled to `median_s`, capped."""

    median_s: float
    alpha: float = 1.5
    max_s: float = 600.0

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """`size` independent sleeps (seconds)."""
        if self.median_s == 0 or size == 0:
            return np.zeros(size)
        x = (1.0 + rng.pareto(self.alpha, size)) / 2 ** (1 / self.alpha)  # classic Pareto, x_m = 1
        return np.minimum(self.median_s * x, self.max_s)

    def harness_sleep_s(self, execution: str, num_calls: int) -> float:
        """The seconds the demo harness of `execution` sleeps in its first `num_calls` tool calls: its
        seed is crc32 of the execution id (services/runner/harnesses.py) and each draw is
        harness/latency.py's `paretovariate(alpha) / 2^(1/alpha) · median`, capped."""
        if self.median_s == 0 or num_calls == 0:
            return 0.0
        rng = random.Random(zlib.crc32(execution.encode()))
        scale = self.median_s / 2 ** (1 / self.alpha)
        return sum(min(scale * rng.paretovariate(self.alpha), self.max_s) for _ in range(num_calls))


@dataclass(frozen=True, slots=True)
class CellCalibration:
    source_runs: tuple[str, ...]
    """The run directories every figure below was measured in."""
    tool_sleep: ToolSleep
    busy: dict[str, tuple[tuple[float, int], ...]]
    """Per suite: (busy seconds, tool calls) of each measured execution."""
    evaluation_s: tuple[float, ...]
    tokens_per_execution: float
    cell_tokens_per_s: float
    step_overhead_s: float
    to_training_s: float
    to_rollout_s: float
    publish_s: float
    model_calls_per_execution: float
    start_s: float
    """Runner seconds per execution start (serial)."""

    @classmethod
    def from_runs(
        cls, runs: Sequence[MeasuredRun], tool_sleep: ToolSleep, backlogs: Sequence[int]
    ) -> CellCalibration:
        """`backlogs[i]`: how many executions run i could start at once (its initial rollout capacity)."""
        if not runs or len(backlogs) != len(runs):
            raise ValueError("calibration needs at least one measured run, and one backlog per run")
        executions = [e for r in runs for e in r.executions]
        busy: dict[str, list[tuple[float, int]]] = {}
        for e in executions:
            busy.setdefault(e.suite, []).append((e.busy_s, e.tool_calls))
        tokens = [t for r in runs for t in r.microstep_tokens]
        seconds = [s for r in runs for s in r.microstep_s]
        packed = [r.tokens_per_execution for r in runs if r.tokens_per_execution > 0]
        if not seconds or not packed:
            raise ValueError("the calibration runs trained nothing (no micro-step was done)")
        return cls(
            source_runs=tuple(r.run_dir for r in runs),
            tool_sleep=tool_sleep,
            busy={suite: tuple(v) for suite, v in sorted(busy.items())},
            evaluation_s=tuple(e.evaluation_s for e in executions),
            tokens_per_execution=statistics.fmean(packed),
            cell_tokens_per_s=sum(tokens) / sum(seconds),
            step_overhead_s=median_or([x for r in runs for x in r.step_overhead_s], 0.0),
            to_training_s=median_or([x for r in runs for x in r.to_training_s], 0.0),
            to_rollout_s=median_or([x for r in runs for x in r.to_rollout_s], 0.0),
            publish_s=median_or([x for r in runs for x in r.publish_s], 0.0),
            model_calls_per_execution=statistics.fmean(e.model_calls for e in executions),
            start_s=statistics.fmean(r.start_interval_s(b) for r, b in zip(runs, backlogs, strict=True)),
        )

    def figures(self) -> dict[str, Any]:
        """The calibration as numbers (for the validation's output)."""
        all_busy = [b for v in self.busy.values() for b, _ in v]
        return {
            "source_runs": list(self.source_runs),
            "tool_sleep": {
                "median_s": self.tool_sleep.median_s,
                "alpha": self.tool_sleep.alpha,
                "max_s": self.tool_sleep.max_s,
                "source": "the harness's arguments in the run",
            },
            "executions_measured": len(all_busy),
            "busy_s_mean": {s: round(statistics.fmean(b for b, _ in v), 2) for s, v in self.busy.items()},
            "tool_calls_mean": {s: round(statistics.fmean(t for _, t in v), 2) for s, v in self.busy.items()},
            "model_calls_per_execution": round(self.model_calls_per_execution, 2),
            "model_call_s": round(statistics.fmean(all_busy) / max(self.model_calls_per_execution, 1e-9), 2),
            "evaluation_s_mean": round(statistics.fmean(self.evaluation_s), 2),
            "cell_train_tokens_per_s": round(self.cell_tokens_per_s, 1),
            "tokens_per_execution": round(self.tokens_per_execution, 1),
            "step_overhead_s": round(self.step_overhead_s, 3),
            "to_training_s": round(self.to_training_s, 4),
            "to_rollout_s": round(self.to_rollout_s, 4),
            "publish_s": round(self.publish_s, 3),
            "runner_start_s": round(self.start_s, 3),
        }


class MeasuredWorkload:
    """Groups drawn from measured executions: group g runs the run's g-th query; each member is a
    measured execution of that query's suite (busy time, tool calls, evaluation latency) plus the
    tool sleeps its own harness draws for that many tool calls."""

    def __init__(self, calibration: CellCalibration, query_order: Sequence[str]) -> None:
        if not query_order:
            raise ValueError("the workload needs the run's query order")
        self.calibration = calibration
        pooled = [x for v in calibration.busy.values() for x in v]
        self._busy = {s: np.array(v, dtype=np.float64) for s, v in calibration.busy.items()}
        self._pooled = np.array(pooled, dtype=np.float64)
        self._suites = [q.split("/")[0] for q in query_order]
        self._evaluation = np.array(calibration.evaluation_s, dtype=np.float64)

    def sample_block(
        self, rng: np.random.Generator, num_groups: int, group_size: int, first_group: int = 0
    ) -> GroupBlock:
        cal = self.calibration
        if first_group + num_groups > len(self._suites):
            raise ValueError(
                f"the query order covers {len(self._suites)} groups; {first_group + num_groups} needed"
            )
        run_s = np.zeros((num_groups, group_size))
        for i in range(num_groups):
            table = self._busy.get(self._suites[first_group + i], self._pooled)
            rows = table[rng.integers(0, len(table), group_size)]
            group = group_id(first_group + i + 1)  # the scheduler numbers groups from 1
            for j, (busy_s, num_calls) in enumerate(rows):
                run_s[i, j] = busy_s + cal.tool_sleep.harness_sleep_s(execution_id(group, j), int(num_calls))
        eval_s = self._evaluation[rng.integers(0, len(self._evaluation), (num_groups, group_size))]
        return GroupBlock(
            run_h=run_s / 3600.0,
            outcome=np.full((num_groups, group_size), COMPLETED, dtype=np.int64),
            eval_h=eval_s / 3600.0,
            tokens=np.full((num_groups, group_size), cal.tokens_per_execution),
        )


def local_preset(
    calibration: CellCalibration,
    *,
    num_cells: int,
    cell_capacity: int,
    group_size: int,
    batch_groups: int,
    rho_min: float,
    tau_s: float,
    microstep_tokens: int,
    steps: int,
    query_order: Sequence[str],
) -> Preset:
    """This machine's stack as a simulator preset: K cells of one node each, measured cell model."""
    cal = calibration
    return Preset(
        name="cpu-stack",
        description=f"this machine's CPU stack: K={num_cells} cells, C_e={cell_capacity}, N={group_size}, "
        f"B={batch_groups}; cell model measured in {len(cal.source_runs)} run(s)",
        num_nodes=num_cells,
        cell_nodes=1,
        executions_per_node=cell_capacity,
        group_size=group_size,
        batch_groups=batch_groups,
        steps=steps,
        workload=MeasuredWorkload(cal, query_order),
        training=TrainingModel(
            node_tokens_per_s=cal.cell_tokens_per_s,
            microstep_tokens=float(microstep_tokens),
            join_s=cal.to_training_s,
            leave_s=cal.to_rollout_s,
            publish_s=cal.publish_s,
            broadcast_s=cal.step_overhead_s,
            step_overhead_s=cal.step_overhead_s,
        ),
        rho_min=rho_min,
        tau_s=tau_s,
        runner_start_s=cal.start_s,
    )


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
