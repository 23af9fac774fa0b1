"""The CPU stack's cell model: tool sleeps as the harness draws them, groups that follow the run's query
order, and a runner that starts executions one at a time."""

from __future__ import annotations

import numpy as np
import pytest

from services.scheduler.policy import Mode
from sim.layout import Layout
from sim.local import CellCalibration, MeasuredWorkload, ToolSleep, local_preset
from sim.simulation import Simulation


def calibration(start_s: float = 0.0, **kw: object) -> CellCalibration:
    fields: dict[str, object] = dict(
        source_runs=("runs/a",),
        tool_sleep=ToolSleep(20.0, 1.5, 120.0),
        busy={"add": ((4.0, 1),), "parts": ((9.0, 2),)},
        evaluation_s=(1.0,),
        tokens_per_execution=400.0,
        cell_tokens_per_s=2000.0,
        step_overhead_s=0.05,
        to_training_s=0.01,
        to_rollout_s=0.01,
        publish_s=0.2,
        model_calls_per_execution=2.0,
        start_s=start_s,
    )
    fields.update(kw)
    return CellCalibration(**fields)  # type: ignore[arg-type]


def test_tool_sleeps_have_the_harness_median_and_cap() -> None:
    sleep = ToolSleep(median_s=20.0, alpha=1.5, max_s=120.0)
    draws = sleep.draw(np.random.default_rng(0), 200_000)
    assert abs(float(np.median(draws)) - 20.0) < 0.3
    assert draws.max() == 120.0 and draws.min() >= 20.0 / 2 ** (1 / 1.5)
    # P(X > 120 s) of a Pareto(1.5) with median 20 s: (x_m / 120)^1.5
    x_m = 20.0 / 2 ** (1 / 1.5)
    assert abs(float((draws >= 120.0).mean()) - (x_m / 120.0) ** 1.5) < 0.003
    assert ToolSleep(0.0).draw(np.random.default_rng(0), 5).tolist() == [0.0] * 5


ORDER = ["add/1+2", "parts/1+2,2+3"] * 300


def test_groups_follow_the_query_order_with_measured_executions_and_their_harness_sleeps() -> None:
    workload = MeasuredWorkload(calibration(tool_sleep=ToolSleep(0.0)), ORDER)
    block = workload.sample_block(np.random.default_rng(1), 4, 3, first_group=1)
    # Group 1 is `parts` (9 s busy), then `add` (4 s), `parts`, `add`.
    assert (block.run_h * 3600.0).tolist() == [[9.0] * 3, [4.0] * 3, [9.0] * 3, [4.0] * 3]
    assert (block.tokens == 400.0).all() and np.allclose(block.eval_h * 3600.0, 1.0)
    slept = MeasuredWorkload(calibration(), ORDER).sample_block(np.random.default_rng(1), 4, 2)
    sleep = calibration().tool_sleep
    # The second group (g00002, `parts`: two tool calls) sleeps what its executions' harnesses draw.
    assert slept.run_h[1] * 3600.0 == pytest.approx(
        [9.0 + sleep.harness_sleep_s("g00002-e00", 2), 9.0 + sleep.harness_sleep_s("g00002-e01", 2)]
    )
    with pytest.raises(ValueError, match="query order covers"):
        workload.sample_block(np.random.default_rng(1), 4, 3, first_group=len(ORDER))


def test_harness_sleeps_repeat_per_execution_and_follow_the_distribution() -> None:
    sleep = ToolSleep(20.0, 1.5, 120.0)
    assert sleep.harness_sleep_s("g00001-e00", 3) == sleep.harness_sleep_s("g00001-e00", 3)
    assert sleep.harness_sleep_s("g00001-e00", 1) < sleep.harness_sleep_s("g00001-e00", 2)
    firsts = [sleep.harness_sleep_s(f"g{g:05d}-e{j:02d}", 1) for g in range(1, 2001) for j in range(8)]
    assert abs(float(np.median(firsts)) - 20.0) < 1.0 and max(firsts) == 120.0


@pytest.mark.parametrize("start_s", [0.0, 0.5])
def test_the_runner_starts_one_execution_at_a_time(start_s: float) -> None:
    preset = local_preset(
        calibration(start_s),
        num_cells=3,
        cell_capacity=12,
        group_size=8,
        batch_groups=4,
        rho_min=0.5,
        tau_s=1.0,
        microstep_tokens=8192,
        steps=2,
        query_order=ORDER,
    )
    layout = Layout(Mode.ELASTIC, num_cells=3, cell_nodes=1, phi=0.5, mu=2)
    sim = Simulation(preset, layout, steps=2, seed=0)
    result = sim.run()
    assert result.steps == 2 and result.executions_started >= 36
    # Every start took the runner start_s, one after another (none at all when it is 0).
    assert sim._runner_free_s >= result.executions_started * start_s
    assert (sim._runner_free_s == 0.0) == (start_s == 0.0)


def test_serial_starts_lengthen_the_run() -> None:
    def total(start_s: float) -> float:
        preset = local_preset(
            calibration(start_s),
            num_cells=3,
            cell_capacity=12,
            group_size=8,
            batch_groups=4,
            rho_min=0.5,
            tau_s=1.0,
            microstep_tokens=8192,
            steps=2,
            query_order=ORDER,
        )
        layout = Layout(Mode.COLOCATE, num_cells=3, cell_nodes=1, phi=0.0, mu=2)
        return Simulation(preset, layout, steps=2, seed=3).run().total_s

    # The first burst's 64 executions (μ·N·B) start a second apart: the ramp adds tens of seconds.
    assert total(1.0) > total(0.0) + 10.0
