"""A 2-step run whose engine samples in bfloat16 and whose trainer scores in float32 (issue 39's acceptance),
audited: the audit measures a non-zero train/inference mismatch at each step from primary data, counts each
correction's clip and mask fractions from the same log ratios as its unit tests predict them
(tests/unit/audit/test_corrections.py), and finds the fractions the trainer logged equal to its own; a copy
of the run whose logged token mask fraction was changed fails the audit, naming it.

The run trains with IcePop and the sequence mask on (bands narrow enough for this small mismatch to drop
targets and executions), so the trainer's logged fractions are not all 0; the audit also evaluates TIS (the
default objective), MIS, IcePop and the sequence mask alone with the run's bounds, offline, from the same
data. Synchronous colocate (μ = 1): every target is sampled at the weights of the step that trains it, so
the mismatch is measured at both steps.

The embedded engine by default; SGLang in bfloat16 with its settings file overlaid (nothing here is
specific to an engine: the audit reads the behaviour log-probs the proxy recorded):

    GYRE_MISMATCH_CONFIG=app/demo/sglang.yaml .venv/bin/python -m pytest -q -s tests/e2e/test_mismatch_run.py

`-s` shows the measured line (`MEASURED {...}`, docs/measured/mismatch-2026-12-07/).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.demo.config import demo_config
from app.demo.run import DemoRun

pytestmark = pytest.mark.slow

STEPS = 2
OBJECTIVE: dict[str, Any] = {
    "token_correction": "icepop",
    "icepop_low": 0.995,
    "icepop_high": 1.005,
    "mis_low": 0.99,
    "mis_high": 1.01,
    "sequence_mask": True,
    "sequence_mask_low": 0.9999,
    "sequence_mask_high": 1.0001,
}
SHAPE: dict[str, Any] = {
    "scheduler": {
        "mode": "colocate",
        "num_cells": 2,
        "group_size": 4,
        "batch_groups": 2,
        "phi": 0.0,
        "mu": 1,
        "rho_min": 0.5,
        "tau_s": 0.2,
        "cell_capacity": 4,
    },
    "tasks": {"queries": ["add"], "held_out": []},
    "packer": {"microstep_tokens": 600},
    "runner": {
        "harness_args": ["--tool-latency-s", "0.2", "--tool-latency-max-s", "1"],
        "sandbox": {"uid_base": 158000},
    },
    "evaluator": {"sandbox": {"uid_base": 159000}},
    "objective": OBJECTIVE,
}


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("mismatch") / "runs"
    overlay = os.environ.get("GYRE_MISMATCH_CONFIG")
    config = demo_config(
        Path(overlay) if overlay else None,
        {
            "run": {"id": "bf16", "dir": str(runs)},
            **SHAPE,
            "cell_agent": {"engine": {"dtype": "bfloat16"}, "trainer": {"dtype": "float32"}},
        },
    )
    DemoRun(config, steps=STEPS).execute()
    return config.run.path


def _audit(run_dir: Path) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["audit", str(run_dir), "--json", "--no-probe"])
    return result.exit_code, json.loads(result.stdout)


def test_the_audit_measures_the_mismatch_and_each_corrections_fractions(bf16_run: Path) -> None:
    code, report = _audit(bf16_run)
    objective = report["objective"]
    mismatch, corrections = objective["mismatch_by_step"], objective["corrections_by_step"]
    measured = {
        "engine": "bfloat16",
        "trainer": "float32",
        "objective": OBJECTIVE,
        "mismatch_by_step": mismatch,
        "corrections_by_step": corrections,
    }
    print("MEASURED " + json.dumps(measured))
    assert code == 0 and report["defects"] == [], report["defects"]
    assert len(mismatch) == len(corrections) == STEPS
    assert objective["corrections_logged_compared"] == STEPS  # the trainer's fractions equal the audit's
    bands = {
        "mis": (OBJECTIVE["mis_low"], OBJECTIVE["mis_high"]),
        "icepop": (OBJECTIVE["icepop_low"], OBJECTIVE["icepop_high"]),
    }
    for m, c in zip(mismatch, corrections, strict=True):
        # μ = 1: every target on-policy, and bfloat16 sampling leaves a mismatch the float32 trainer sees
        assert m["tokens"] == c["targets"] > 0 and m["k3_kl_token_mean"] > 0 and m["mean_abs"] > 1e-5, m
        v = c["variants"]
        # tis drops nothing
        assert v["tis"]["token_mask_fraction"] == 0 and v["tis"]["sequence_mask_fraction"] == 0
        # a band drops a target iff its ratio leaves the band: none when every |log ρ| is inside it, some
        # when the largest one is outside
        for name, (low, high) in bands.items():
            inner = min(-math.log(low), math.log(high))
            outer = max(-math.log(low), math.log(high))
            if m["max_abs"] > outer:
                assert v[name]["token_mask_fraction"] > 0, (name, c)
            if m["max_abs"] < inner:
                assert v[name]["token_mask_fraction"] == 0, (name, c)
            assert v[name]["sequence_mask_fraction"] == 0
        # icepop's band lies inside mis's: it drops at least the targets mis drops
        assert v["icepop"]["token_mask_fraction"] >= v["mis"]["token_mask_fraction"] > 0
        # the sequence mask drops executions, never a single target; the run's token mask is icepop's
        assert (
            v["sequence_mask"]["sequence_mask_fraction"] > 0
            and v["sequence_mask"]["token_mask_fraction"] == 0
        )
        assert v["run"]["token_mask_fraction"] == v["icepop"]["token_mask_fraction"]
        # the trainer logged the run's objective: its fractions are the audit's (here no decision near a bound)
        logged = c["logged"]
        assert logged["token_mask_fraction"] == pytest.approx(v["run"]["token_mask_fraction"], abs=1e-12)
        assert logged["sequence_mask_fraction"] == pytest.approx(
            v["run"]["sequence_mask_fraction"], abs=1e-12
        )
        assert logged["num_mismatch_targets"] == m["tokens"]


def test_a_changed_trainer_metric_is_a_defect(bf16_run: Path, tmp_path: Path) -> None:
    run = tmp_path / bf16_run.name
    shutil.copytree(
        bf16_run, run, ignore=shutil.ignore_patterns("nats", "workspaces", "sandboxes", "evaluations")
    )
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["token_mask_fraction"] = 0.0  # the trainer reports it masked nothing at step 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, report = _audit(run)
    assert code == 1
    assert any(
        d.startswith("objective: step 1: the trainer logged token_mask_fraction 0,")
        for d in report["defects"]
    ), report["defects"]
