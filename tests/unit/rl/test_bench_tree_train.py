"""`gyre bench tree-train` runs under its hyphenated name and reports its fields (the timings are
measured, not asserted here; what follows from the data is: the tree layout trains fewer tokens and
the same gradient)."""

import json

from typer.testing import CliRunner

from app.cli import app


def test_bench_tree_train_prints_both_layouts_per_family():
    args = ["bench", "tree-train", "--json", "--quick", "--steps", "1", "--executions", "1", "--repeats", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # its whole stdout: progress goes to stderr
    fields = ("tokens_paths", "tokens_tree", "token_ratio", "step_s_paths", "step_s_tree", "speedup")
    assert set(report["families"]) == {"appendix_c", "replay"}
    for family in (report, *report["families"].values()):
        assert all(family[k] > 0 for k in fields)
        assert family["tokens_tree"] < family["tokens_paths"] and family["token_ratio"] > 1.2
        assert family["grad_max_rel_diff"] <= 1e-5
    assert report["regime"].startswith("CPU") and "parameters" in report["regime"]
    assert isinstance(report["goal_met_appendix_c"], bool)
    assert "tree-train" in CliRunner().invoke(app, ["bench", "--list"]).output.split()
