"""`gyre sim run / ablation / presets`: the last line of --json output is one JSON object."""

import json

from typer.testing import CliRunner

from app.cli import app

runner = CliRunner()


def _last_json(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def test_sim_run_json_reports_times_staleness_utilization_and_counts(tmp_path):
    plot = tmp_path / "timeline.png"
    result = runner.invoke(
        app,
        [
            "sim",
            "run",
            "--preset",
            "nl2repo-122b",
            "--mode",
            "elastic",
            "--steps",
            "3",
            "--json",
            "--plot",
            str(plot),
        ],
    )
    assert result.exit_code == 0, result.output
    out = _last_json(result.output)
    assert len(out["step_times_h"]) == 3 and out["total_h"] > 0
    assert out["executions_simulated"] > 0 and out["wall_s"] >= 0
    assert {"rollout_utilization", "training_utilization", "mean_staleness_all_steps"} <= set(out)
    assert plot.exists() and out["plot"] == str(plot)


def test_sim_run_text_and_bad_input():
    result = runner.invoke(app, ["sim", "run", "--mode", "colocate", "--steps", "4"])
    assert result.exit_code == 0, result.output
    assert "mean staleness" in result.output and "utilization" in result.output
    bad = runner.invoke(app, ["sim", "run", "--phi", "0.3", "--steps", "1"])
    assert bad.exit_code == 2 and "pick phi as a multiple of 1/32" in bad.output
    unknown = runner.invoke(app, ["sim", "run", "--preset", "nope"])
    assert unknown.exit_code == 2 and "unknown preset" in unknown.output


def test_sim_ablation_json_has_every_row_with_the_papers_ratio():
    result = runner.invoke(app, ["sim", "ablation", "--preset", "nl2repo-122b", "--steps", "3", "--json"])
    assert result.exit_code == 0, result.output
    out = _last_json(result.output)
    assert set(out["configs"]) == {"A0", "A1", "A2", "A3", "C0", "C1", "C2", "C3", "E0", "E1", "E2"}
    assert out["configs"]["E0"]["ratio_vs_e0"] == 1.0
    assert out["configs"]["A0"]["paper_ratio_vs_e0"] == 1.556
    assert {"total_h", "ratio_vs_e0", "paper_ratio_vs_e0"} <= set(out["configs"]["C2"])
    # Every figure of the preset is disclosed with its source; none is this machine's.
    sources = out["calibration"]
    assert sources["training.join_s"] == {"value": 8.52, "source": "paper"}
    assert sources["workload.sigma_query"]["source"] == "fitted"
    assert sources["training.node_tokens_per_s"]["source"] == "assumed"
    assert "Table 2" in sources["training.node_tokens_per_s"]["note"]
    assert out["regime"].startswith("cluster scale") and out["validation"] is None
    swept = _last_json(
        runner.invoke(
            app, ["sim", "ablation", "--steps", "1", "--json", "--node-tokens-per-s", "9000"]
        ).output
    )
    assert swept["calibration"]["training.node_tokens_per_s"] == {
        "value": 9000.0,
        "source": "--node-tokens-per-s",
    }


def test_sim_presets_lists_every_preset():
    result = runner.invoke(app, ["sim", "presets", "--json"])
    assert result.exit_code == 0, result.output
    out = _last_json(result.output)
    assert set(out) == {"nl2repo-122b", "deepswe-122b", "terminalbench-122b", "nl2repo-2.4t"}


def test_sim_run_pool_reports_elastic_against_the_fixed_pool_and_the_baselines_per_capacity_hour():
    out = _last_json(
        runner.invoke(
            app, ["sim", "run", "--preset", "paper", "--pool", "failures", "--steps", "3", "--json"]
        ).output
    )
    assert out["preset"] == "nl2repo-122b" and out["pool"]["scenario"] == "failures"
    report = out["pool_comparison"]
    runs = report["runs"]
    assert set(runs) == {
        "elastic",
        "elastic_fixed_pool",
        "async",
        "async_fixed_pool",
        "async_no_restart",
        "colocate",
        "colocate_fixed_pool",
        "colocate_no_restart",
    }
    assert runs["elastic"]["total_h"] == round(out["total_h"], 3)  # the run above, not another
    assert runs["async"]["restart_s"] == report["parameters"]["restart_s"] == 900.0
    assert runs["async_no_restart"]["restart_s"] == 0.0 and runs["elastic"]["restart_s"] is None
    for name, run in runs.items():
        assert abs(run["steps_per_1k_node_h"] - 1000 * 3 / run["capacity_node_h"]) < 1e-3  # (node-h rounded)
        if name != "elastic":
            expected = runs["elastic"]["steps_per_1k_node_h"] / run["steps_per_1k_node_h"]
            assert report["speedup_per_capacity_hour"][name] == round(expected, 3)
            assert report["speedup_time_to_finish"][name] == round(
                run["total_h"] / runs["elastic"]["total_h"], 3
            )
    assert runs["colocate"]["restarts"] == runs["colocate"]["cells_lost"] > 0  # a static job restarts
    assert runs["elastic_fixed_pool"]["cells_lost"] == 0


def test_sim_run_pool_fixed_and_overrides_and_bad_input():
    out = _last_json(runner.invoke(app, ["sim", "run", "--pool", "fixed", "--steps", "2", "--json"]).output)
    report = out["pool_comparison"]
    assert report["speedup_per_capacity_hour"]["elastic_fixed_pool"] == 1.0
    assert "async_no_restart" not in report["runs"]  # nothing is lost: no restart to discount
    swept = _last_json(
        runner.invoke(
            app, ["sim", "run", "--pool", "spot", "--restart-s", "60", "--steps", "2", "--json"]
        ).output
    )
    assert swept["pool_comparison"]["parameters"]["restart_s"] == 60.0
    text = runner.invoke(app, ["sim", "run", "--mode", "async", "--pool", "grow", "--steps", "2"])
    assert text.exit_code == 0 and "pool grow:" in text.output and "elastic_fixed_pool" in text.output
    unknown = runner.invoke(app, ["sim", "run", "--pool", "nope"])
    assert unknown.exit_code == 2 and "unknown pool scenario 'nope'" in unknown.output
    orphan = runner.invoke(app, ["sim", "run", "--restart-s", "5"])
    assert orphan.exit_code == 2 and "--restart-s needs --pool" in orphan.output
