"""The megatron backend against transformers on the same tiny weights, at TP 1 and TP 2 (gloo, spawned
ranks): per-token log-probs, one Gyre-objective AdamW step, HF → Megatron → HF through the model's
flat buffers, checkpoint save/load, tree-packed rows against their paths, and bad input refused
before any process group exists."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest

from gyre.model.files import check_model_dir
from tests.unit.megatron.helpers import family_dir
from tests.unit.megatron.workers import trainer_worker
from tests.unit.rl.test_tree_gradient import MODEL, microsteps

FAMILIES = ["qwen3", "llama", "qwen2", "qwen3_yarn"]


def _job() -> dict[str, Any]:
    (tree_step,), (path_step,) = microsteps("tree"), microsteps("paths")
    assert tree_step.tree is not None and not tree_step.tree.is_paths
    bad = {**check_model_dir(family_dir("llama")).arch.raw, "attention_bias": True}
    return {
        "families": {f: str(family_dir(f)) for f in FAMILIES},
        "tree": (str(MODEL), tree_step, path_step),
        "bad_llama": bad,
    }


def _run(world: int, tmp_path: Path) -> dict[int, dict[str, Any]]:
    ctx = mp.get_context("spawn")
    ports, results = ctx.Queue(), ctx.Queue()
    job = _job()
    procs = [
        ctx.Process(target=trainer_worker, args=(r, world, job, ports, results, str(tmp_path)))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    reports: dict[int, dict[str, Any]] = {r: {"families": {}} for r in range(world)}
    finished = 0
    while finished < world:
        rank, kind, body = results.get(timeout=280)
        assert kind != "error", f"rank {rank}: {body['error']}"
        if kind == "family":
            reports[rank]["families"][body["family"]] = body
        elif kind == "done":
            finished += 1
        else:
            reports[rank][kind] = body
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * world
    return reports


def _check(reports: dict[int, dict[str, Any]], tp: int) -> None:
    for rank, report in reports.items():
        bad = report["bad_input"]
        assert "attention_bias: true is not supported by the megatron backend" in bad["message"], bad
        assert not bad["dist_before"] and not bad["dist_after"], "refused before any process group started"
        tree = report["tree"]
        assert tree["grad_max_abs"] > 1e-3, tree
        assert tree["grad_max_diff"] <= 1e-5 * tree["grad_max_abs"], (
            "tree rows give the paths' gradient",
            tree,
        )
        assert tree["loss_tree"] == pytest.approx(tree["loss_paths"], rel=1e-5), tree
        assert set(report["families"]) == set(FAMILIES)
        for family, r in report["families"].items():
            where = f"rank {rank} {family}"
            assert r["roundtrip_exact"], where
            assert r["logprob_max_abs_diff"] < 1e-4, (where, r["logprob_max_abs_diff"])
            assert r["param_max_rel_moved"] > 1e-3, (where, "the step must move the weights", r)
            assert r["params_close"] and r["param_max_rel_diff"] < 1e-5, (where, r["param_max_rel_diff"])
            assert abs(r["norm"] - r["reference_norm"]) <= 1e-5 * r["reference_norm"], (
                where,
                r["norm"],
                r["reference_norm"],
            )
            assert r["max_chunks"] > 1, (where, "some micro-step must take the chunked path")
            assert r["version"] == 1 and r["checkpoint_restored"] and r["optimizer_restored"], where
            assert {"config.json", "model.safetensors", "tokenizer.json", "trainer.json"} <= set(
                r["checkpoint_files"]
            )
            assert {f"optimizer-tp{k}-of-{tp}.pt" for k in range(tp)} <= set(r["checkpoint_files"]), r[
                "checkpoint_files"
            ]


@pytest.mark.slow
def test_tp1_matches_transformers(tmp_path: Path) -> None:
    _check(_run(1, tmp_path), 1)


@pytest.mark.slow
def test_tp2_matches_transformers(tmp_path: Path) -> None:
    reports = _run(2, tmp_path)
    _check(reports, 2)
    for family in FAMILIES:
        a, b = reports[0]["families"][family], reports[1]["families"][family]
        assert a["loss"] == b["loss"] and a["norm"] == b["norm"], (
            "every TP rank computes the same loss and norm"
        )
