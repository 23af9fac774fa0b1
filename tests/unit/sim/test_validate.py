"""`gyre sim validate` on a recorded `gyre bench e2e` result (tests/fixtures/sim_e2e: the three 6-step runs of
the real stack that README's figures come from, trimmed by `sim.measured.trim_run`): what is read from a run,
that each mode is calibrated on the other modes only, that the simulator predicts each mode within the bound
README states (checked against this data, so a drifting simulator fails here), that a prediction perturbed
beyond the bound fails that check, and what the command prints."""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli import app
from sim.local import ToolSleep
from sim.measured import REPORTS_FILE, read_run, trim_run
from sim.validate import validate

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "sim_e2e"
BENCH = json.loads((FIXTURE / "bench.json").read_text())
STEPS = int(BENCH["steps"])
BOUND = 0.15
"""|predicted − measured| / measured per mode, as README states for `gyre sim validate`."""
runner = CliRunner()


def measured(tmp_path: Path, modes: tuple[str, ...] = ("elastic", "async", "colocate")) -> dict[str, Any]:
    result = json.loads((FIXTURE / "bench.json").read_text())  # run_dir relative to the fixture
    result["runs"] = {m: {**result["runs"][m], "run_dir": str(FIXTURE / m)} for m in modes}
    return dict(result)


def test_a_run_is_read_as_the_stack_recorded_it() -> None:
    run = read_run(FIXTURE / "elastic")
    rows = [json.loads(line) for line in (FIXTURE / "elastic" / REPORTS_FILE).read_text().splitlines()]
    reports = {r["execution_id"]: r["report"] for r in rows}
    assert 0 < len(run.executions) <= len(reports)
    first = run.executions[0]
    report = reports[first.execution_id]
    assert (first.tool_sleep_s, first.model_calls, first.tool_calls) == (
        report["tool_sleep_s"],
        report["calls"],
        report["tool_calls"],
    )
    assert first.busy_s == pytest.approx(max(0.0, first.duration_s - first.tool_sleep_s))
    assert run.microstep_tokens_per_s == pytest.approx(sum(run.microstep_tokens) / sum(run.microstep_s))
    assert run.scheduled_s(STEPS) == run.step_end_s[STEPS - 1] and run.scheduled_s(99) is None
    assert {e.suite for e in run.executions} <= {"add", "parts"}


def test_a_trimmed_run_reads_as_the_run_it_was_trimmed_from(tmp_path: Path) -> None:
    """`trim_run` keeps what `read_run` reads: a run laid out as the stack leaves it (the harnesses' reports in
    their sandboxes, events the validation does not read) and its trimmed copy read the same."""
    full = tmp_path / "full"
    shutil.copytree(FIXTURE / "elastic", full, ignore=shutil.ignore_patterns(REPORTS_FILE))
    for line in (FIXTURE / "elastic" / REPORTS_FILE).read_text().splitlines():
        row = json.loads(line)
        control = full / "sandboxes" / row["execution_id"] / "control"
        control.mkdir(parents=True)
        (control / "stdout.log").write_text("a harness's own output\n" + json.dumps(row["report"]) + "\n")
    noise = {"type": "gyre.v1.CellHealth", "time_s": 1.0, "event": {"cell": 0}}
    with (full / "events.jsonl").open("a") as events:
        events.write(json.dumps(noise) + "\n")
    trim_run(full, tmp_path / "trimmed")
    assert not (tmp_path / "trimmed" / "sandboxes").exists()
    assert "CellHealth" not in (tmp_path / "trimmed" / "events.jsonl").read_text()
    as_run, as_trimmed = read_run(full), read_run(tmp_path / "trimmed")
    assert dataclasses.replace(as_trimmed, run_dir=as_run.run_dir) == as_run
    assert len(as_run.executions) > 100


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
        assert m["measured_s"] == pytest.approx(read_run(FIXTURE / mode).scheduled_s(STEPS), abs=0.05)
        assert m["within_goal"] == (abs(m["error"]) <= 0.15)
    assert report["max_abs_error"] == max(abs(m["error"]) for m in report["modes"].values())
    assert validate(measured(tmp_path), seeds=8) == report  # deterministic under its seeds


def outside_bound(report: dict[str, Any]) -> list[str]:
    """The modes whose prediction misses the measured time by more than the bound."""
    return sorted(mode for mode, m in report["modes"].items() if abs(m["error"]) > BOUND)


def _percent(error: float) -> str:
    return f"{100 * error:+.1f}%".replace("-", "\u2212")


def test_the_simulator_predicts_each_measured_mode_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """README's figures, reproduced as sim/README.md gives the command (from the repository root, the committed
    result, 32 draws per mode): each mode within the bound, and README's and sim/README.md's figures are
    this output's."""
    monkeypatch.chdir(REPO)
    measured_file = "tests/fixtures/sim_e2e/bench.json"
    result = runner.invoke(app, ["sim", "validate", "--measured", measured_file, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    print(
        json.dumps({m: (v["measured_s"], v["predicted_s"], v["error"]) for m, v in report["modes"].items()})
    )
    assert report["steps"] == STEPS == 6 and not report["warnings"], report["warnings"]
    assert outside_bound(report) == [], {m: v["error"] for m, v in report["modes"].items()}

    modes = report["modes"]
    readme = " ".join((REPO / "README.md").read_text().split())
    wall = [int(BENCH["runs"][m]["wall_s"] + 0.5) for m in modes]
    scheduled = [int(m["measured_s"] + 0.5) for m in modes.values()]
    ratios = report["speedup_vs_colocate"]["measured"], report["speedup_vs_async"]["measured"]
    assert "elastic {} s, async {} s, colocate {} s of wall time".format(*wall) in readme, wall
    assert (
        "took {}, {} and {} s: {:.2f}\u00d7 over colocate, {:.2f}\u00d7 over async".format(
            *scheduled, *ratios
        )
        in readme
    ), (scheduled, ratios)
    errors = ", ".join(f"{m} {_percent(v['error'])}" for m, v in modes.items())
    assert f"({errors};" in readme, errors
    table = (REPO / "sim" / "README.md").read_text()
    assert f"`gyre sim validate --measured {measured_file}`" in table
    for mode, m in modes.items():
        row = (
            f"| {mode} ({m['phi']:g}, {m['mu']}) | {m['measured_s']:.1f} | {m['predicted_s']:.1f} "
            f"({m['predicted_p10_s']:.0f}\u2013{m['predicted_p90_s']:.0f}) | {_percent(m['error'])} |"
        )
        assert row in table, row


def test_a_prediction_perturbed_beyond_the_bound_fails_that_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above can fail: each mode's prediction in turn, scaled to miss by 1.1 × the bound (over, then
    under), is the one the check names."""
    import sim.validate

    base = validate(measured(tmp_path), seeds=8)
    original = sim.validate.predict
    for mode, m in base["modes"].items():
        for miss in (1.1 * BOUND, -1.1 * BOUND):
            factor = (1 + miss) * m["measured_s"] / m["predicted_s"]

            def perturbed(
                calibration: Any,
                settings: Any,
                *,
                steps: int,
                seeds: int,
                f: float = factor,
                target: str = mode,
            ) -> list[float]:
                totals = original(calibration, settings, steps=steps, seeds=seeds)
                return [t * f for t in totals] if settings.mode.value == target else totals

            monkeypatch.setattr(sim.validate, "predict", perturbed)
            report = validate(measured(tmp_path), seeds=8)
            assert report["modes"][mode]["error"] == pytest.approx(miss, abs=0.002)
            assert outside_bound(report) == sorted({mode} | set(outside_bound(base))), report["modes"]
    monkeypatch.setattr(sim.validate, "predict", original)


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
