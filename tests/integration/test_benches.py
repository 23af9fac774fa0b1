"""Every benchmark of `gyre bench --list` runs to its JSON line at a tiny size, so none rots unnoticed, and
with `--json` that line is all its standard output.

`TINY` is the one table: a benchmark's name → the arguments of its tiny run (run here as a user runs it,
`gyre bench NAME --json ARGS` in a fresh process, in a scratch directory), or `Covered("tests/…::test")`
naming the test that already runs it at a tiny size (checked to exist and to run that benchmark), so
nothing runs twice. A benchmark added to bench/ without an entry fails `test_every_benchmark_has_a_tiny_run`.
The figures a tiny run prints are not asserted: a benchmark measures, a test checks that it runs.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench._cli import _names as bench_names
from tests.support.sglang import sglang_python

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Covered:
    """The benchmark's tiny run is this test (`path::function`)."""

    test: str


# A run small enough for the demo-based benchmarks: K = 2 cells (a core and a satellite: a third cell
# only adds its start-up), two groups of two executions per step, short tool sleeps (the stack's start is
# most of their time). Each gets sandbox uids of its own
# (`--uid-base`): a runner kills every process of the uids it takes, so two stacks must never share them.
TINY_DEMO = {
    "scheduler": {
        "num_cells": 2,
        "group_size": 2,
        "batch_groups": 2,
        "phi": 0.5,
        "mu": 2,
        "rho_min": 0.5,
        "tau_s": 0.2,
        "cell_capacity": 2,
    },
    "tasks": {"queries": ["add/1+5"], "held_out": ["add/2+2"], "held_out_samples": 1},
    "runner": {"harness_args": ["--tool-latency-s", "0.2", "--tool-latency-max-s", "0.5"]},
}
TINY_HARNESS = TINY_DEMO["runner"]["harness_args"]  # bench e2e sets them from its own flags

TINY: dict[str, list[str] | Covered] = {
    "cluster": Covered(
        "tests/integration/test_compose_cluster.py::test_reduced_compose_run_trains_through_a_satellite_container_kill"
    ),
    "e2e": [
        "--steps",
        "1",
        "--modes",
        "elastic",
        "--config",
        "{tiny_demo}",
        "--uid-base",
        "186000",
        *TINY_HARNESS,
    ],
    "engine": ["--decode-tokens", "4", "--long-prompt", "32", "--backend", "sglang,embedded,transformers"],
    "faults": ["--steps", "1", "--only", "scheduler", "--uid-base", "190000", *TINY_HARNESS],
    "gpu": Covered(
        "tests/unit/megatron/test_bench_gpu.py::test_without_cuda_it_prints_cuda_false_and_exits_0"
    ),
    "kube": Covered(
        "tests/integration/test_kube_play.py::test_reduced_kube_play_trains_through_a_cell_pod_deletion"
    ),
    "r3": Covered(
        "tests/e2e/test_routing_replay.py::test_routing_replay_agrees_on_every_token_and_lowers_the_mismatch"
    ),
    "redteam": Covered(
        "tests/integration/test_redteam.py::test_every_attack_class_fails_in_each_boundary_launcher"
    ),
    "harness": ["--executions", "2", "--concurrency", "2", "--group-size", "2", "--start", "plain"],
    "learn": [
        "--steps",
        "1",
        "--seeds",
        "0",
        "--corrections",
        "icepop",
        "--config",
        "{tiny_demo}",
        "--uid-base",
        "188000",
    ],
    "load": Covered(
        "tests/integration/test_bench_load.py::test_bench_load_answers_every_call_and_reports_its_fields"
    ),
    "packing": Covered(
        "tests/unit/rl/test_bench_packing.py::test_gyre_bench_accepts_json_and_passes_the_rest_to_the_benchmark"
    ),
    "proxy": [
        "--small-samples",
        "3",
        "--large-samples",
        "1",
        "--history-kb",
        "16",
        "--concurrency",
        "2",
        "--duration-s",
        "0.3",
    ],
    "sandbox": ["--executions", "1", "--concurrency", "1", "--no-build"],
    "switch": ["--cycles", "1", "--inflight", "2"],
    "train": ["--microsteps", "2", "--token-budget", "64", "--steps", "2"],
    "tree": ["--quick", "--repeats", "2"],
    "tree-train": Covered(
        "tests/unit/rl/test_bench_tree_train.py::test_bench_tree_train_prints_both_layouts_per_family"
    ),
    "weights": ["--mib", "1", "--repeats", "1"],
}

RUNS = sorted(name for name, entry in TINY.items() if not isinstance(entry, Covered))
SGLANG_TINY = {
    "proxy": ["--backend", "sglang", "--sglang-samples", "2"],
    "switch": ["--backend", "sglang", "--cycles", "1", "--inflight", "2"],
}
"""The benches with a `--backend sglang` mode, each once against the real server (`make setup`'s)."""
COVERED = sorted((name, entry.test) for name, entry in TINY.items() if isinstance(entry, Covered))


def test_every_benchmark_has_a_tiny_run() -> None:
    assert sorted(TINY) == bench_names(), "add the new benchmark's tiny run to TINY"


@pytest.mark.parametrize(("name", "test"), COVERED, ids=[n for n, _ in COVERED])
def test_a_covered_benchmark_names_a_test_that_runs_it(name: str, test: str) -> None:
    path, _, function = test.partition("::")
    source = (REPO / path).read_text()
    found = {
        node.name: ast.get_source_segment(source, node) or ""
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef)
    }
    assert function in found, f"{test} does not exist"
    body = found[function]
    assert f'"{name}"' in body and ('"bench"' in body or f"bench import {name}" in source), (
        f"{test} does not run `gyre bench {name}`"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_the_benchmark_prints_its_json_line_at_a_tiny_size(name: str, tmp_path: Path) -> None:
    tiny_demo = tmp_path / "tiny-demo.yaml"
    tiny_demo.write_text(json.dumps(TINY_DEMO))
    entry = TINY[name]
    assert isinstance(entry, list)
    report = _bench(name, [a.format(tiny_demo=tiny_demo) for a in entry], tmp_path)
    if name == "sandbox" and "container" in report:  # its runs end with none of their containers left
        from tests.support.containers import containers_of, engine_client

        assert [c for c in containers_of(engine_client()) if c.startswith("gyre-bsbx")] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SGLANG_TINY))
def test_the_benchmark_against_the_real_sglang_prints_its_json_line(name: str, tmp_path: Path) -> None:
    sglang_python()  # a failure under CI, a skip elsewhere, without `make setup`'s SGLang
    report = _bench(name, SGLANG_TINY[name], tmp_path)
    assert report["backend"] == "sglang", report
    if name == "proxy":
        shares = report["sglang"]
        assert shares["samples_b1"] == 2 and shares["samples_b16"] == 16 and shares["direct_ms_p50_b1"] > 0
    else:
        assert report["training_to_rollout_s_p50"] > 0 and report["requests_handed_back"] >= 1


def _bench(name: str, args: list[str], cwd: Path) -> dict[str, Any]:
    """`gyre bench NAME --json ARGS`: its whole stdout as one JSON object (progress and logs on stderr)."""
    result = subprocess.run(
        [sys.executable, "-c", "from app.cli import main; main()", "bench", name, "--json", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    tail = result.stderr[-3000:]
    assert result.returncode == 0, f"gyre bench {name} exited {result.returncode}:\n{tail}"
    try:  # its whole stdout, so `gyre bench NAME --json | jq` works: progress and logs go to stderr
        report = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"gyre bench {name}: stdout is not one JSON object:\n{result.stdout[-2000:]}\n{tail}")
    assert isinstance(report, dict) and report, result.stdout
    return report
