"""`gyre sim validate` on a recorded `gyre bench e2e` result (tests/fixtures/sim_e2e: three 2-step runs of
the real stack, trimmed by `sim.measured.trim_run`): what is read from a run, that each mode is
calibrated on the other modes only, and what the command prints."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gyre.cli import app
from sim.local import ToolSleep
from sim.measured import read_run
from sim.validate import validate

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "sim_e2e"
runner = CliRunner()


def measured(tmp_path: Path, modes: tuple[str, ...] = ("elastic", "async", "colocate")) -> dict[str, Any]:
    result = json.loads((FIXTURE / "bench.json").read_text())
    result["runs"] = {m: {**result["runs"][m], "run_dir": str(FIXTURE / m)} for m in modes}
    return dict(result)


def test_a_run_is_read_as_the_stack_recorded_it() -> None:
    run = read_run(FIXTURE / "elastic")
    reports = sorted((FIXTURE / "elastic" / "sandboxes").glob("*/control/stdout.log"))
    assert len(run.executions) == len(reports) > 0
    first = next(e for e in run.executions if e.execution_id == reports[0].parent.parent.name)
    report = json.loads(reports[0].read_text())
    assert (first.tool_sleep_s, first.model_calls, first.tool_calls) == (
        report["tool_sleep_s"],
        report["calls"],
        report["tool_calls"],
    )
    assert first.busy_s == pytest.approx(max(0.0, first.duration_s - first.tool_sleep_s))
    assert run.microstep_tokens_per_s == pytest.approx(sum(run.microstep_tokens) / sum(run.microstep_s))
    assert run.scheduled_s(2) == run.step_end_s[1] and run.scheduled_s(99) is None
    assert {e.suite for e in run.executions} <= {"add", "parts"}


def test_the_simulator_draws_exactly_the_sleeps_each_harness_slept() -> None:
    latency = json.loads((FIXTURE / "bench.json").read_text())["tool_latency"]
    sleep = ToolSleep(latency["median_s"], latency["alpha"], latency["max_s"])
    executions = [e for mode in ("elastic", "async", "colocate") for e in read_run(FIXTURE / mode).executions]
    assert sum(e.tool_calls for e in executions) > 20
    for e in executions:
        assert sleep.harness_sleep_s(e.execution_id, e.tool_calls) == pytest.approx(e.tool_sleep_s, abs=2e-3)


def test_each_mode_is_predicted_from_the_other_modes_runs(tmp_path: Path) -> None:
    report = validate(measured(tmp_path), seeds=8)
    assert set(report["modes"]) == {"elastic", "async", "colocate"}
    for mode, m in report["modes"].items():
        sources = {Path(r).name for r in m["calibration"]["source_runs"]}
        assert sources == {"elastic", "async", "colocate"} - {mode} and not m["in_sample"]
        assert m["error"] == pytest.approx((m["predicted_s"] - m["measured_s"]) / m["measured_s"], abs=0.015)
        assert m["predicted_p10_s"] <= m["predicted_s"] <= m["predicted_p90_s"]
        assert m["measured_s"] == pytest.approx(read_run(FIXTURE / mode).scheduled_s(2), abs=0.05)
        assert m["within_goal"] == (abs(m["error"]) <= 0.15)
    assert report["max_abs_error"] == max(abs(m["error"]) for m in report["modes"].values())
    assert validate(measured(tmp_path), seeds=8) == report  # deterministic under its seeds


def test_the_calibration_is_the_runs_own_figures(tmp_path: Path) -> None:
    report = validate(measured(tmp_path), seeds=2)
    figures = report["modes"]["elastic"]["calibration"]
    others = [read_run(FIXTURE / m) for m in ("async", "colocate")]
    tokens = sum(t for r in others for t in r.microstep_tokens)
    seconds = sum(s for r in others for s in r.microstep_s)
    assert figures["cell_train_tokens_per_s"] == pytest.approx(tokens / seconds, abs=0.1)
    busy = [e.busy_s for r in others for e in r.executions if e.suite == "add"]
    assert figures["busy_s_mean"]["add"] == pytest.approx(statistics.fmean(busy), abs=0.01)
    assert (
        figures["tool_sleep"]["median_s"]
        == json.loads((FIXTURE / "bench.json").read_text())["tool_latency"]["median_s"]
    )


def test_a_single_mode_is_calibrated_in_sample_and_says_so(tmp_path: Path) -> None:
    report = validate(measured(tmp_path, ("async",)), seeds=2)
    assert report["modes"]["async"]["in_sample"] and "speedup_vs_async" not in report


def test_the_command_prints_one_json_object_and_refuses_what_is_not_a_bench_result(tmp_path: Path) -> None:
    saved = tmp_path / "e2e.json"
    saved.write_text("progress line\n" + json.dumps(measured(tmp_path)) + "\n")
    result = runner.invoke(app, ["sim", "validate", "--measured", str(saved), "--seeds", "4", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert set(out["modes"]) == {"elastic", "async", "colocate"} and "CPU stack" in out["regime"]
    text = runner.invoke(app, ["sim", "validate", "--measured", str(saved), "--seeds", "4"])
    assert text.exit_code == 0 and "calibration for elastic" in text.output

    validation = tmp_path / "validation.json"
    validation.write_text(result.output)
    ablation = runner.invoke(
        app, ["sim", "ablation", "--steps", "2", "--json", "--validation", str(validation)]
    )
    assert ablation.exit_code == 0, ablation.output
    disclosed = json.loads(ablation.output.strip().splitlines()[-1])["validation"]
    assert disclosed["errors"] == {m: v["error"] for m, v in out["modes"].items()}

    bad = tmp_path / "bad.json"
    bad.write_text('{"elastic_s": 1}\n')
    refused = runner.invoke(app, ["sim", "validate", "--measured", str(bad)])
    assert refused.exit_code == 2 and "not a gyre bench e2e result" in refused.output
    missing = runner.invoke(app, ["sim", "validate", "--measured", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "--measured" in missing.output
