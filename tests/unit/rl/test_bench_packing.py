"""The packing benchmark runs and reports its fields (its numbers are measured, not asserted here,
except relations that follow from the data: packing beats padding every row to the longest)."""

import json

from bench import packing


def test_bench_packing_prints_one_json_object_last(capsys):
    packing.main(["--groups", "4", "--group-size", "4", "--repeats", "1", "--token-budget", "4096"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("rows_per_s", "tokens_per_s", "padding_fraction", "padding_fraction_naive"):
        assert key in result
    assert result["rows_per_s"] > 0 and result["tokens_per_s"] > 0
    assert 0.0 <= result["padding_fraction"] < result["padding_fraction_naive"] < 1.0


def test_gyre_bench_accepts_json_and_passes_the_rest_to_the_benchmark():
    from typer.testing import CliRunner

    from app.cli import app

    args = ["bench", "packing", "--json", "--groups", "4", "--group-size", "4", "--repeats", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "padding_fraction" in json.loads(result.output.strip().splitlines()[-1])
    unknown = CliRunner().invoke(app, ["bench", "no_such_bench", "--json"])
    assert unknown.exit_code == 2 and "unknown benchmark" in unknown.output
