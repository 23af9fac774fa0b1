"""`gyre bench tree-train`: forward-backward tokens and seconds per training step with the admitted
trajectories packed as path rows (`packer.row_layout: paths`) against tree rows (`tree`), in one run.

    gyre bench tree-train [--steps 3] [--executions 2] [--repeats 2] [--threads 1] [--quick] [--json]

Per tree family (`bench/_tree_shapes.py`: `appendix_c`, Appendix-C-shaped executions with a main
agent and a sub-agent that each compact, and retries; `replay`, Claude-Code-shaped capture sessions
rebuilt by `gyre.trajectory.replay`) and per step: `--executions` executions are admitted
(J_max = 5, the packer's seeding), materialized both ways, packed (`gyre.rl.packing.pack`, a budget
that leaves no micro-step oversize, so neither layout takes the chunked path) and trained with
`gyre.rl.step_loss.train_microstep` (forward + backward, gradients accumulated) on the default
embedded model in float32. A step is timed from the first micro-step to the last backward; the two
layouts alternate, after one warm-up each, and the median of `--repeats` is kept.

    tokens_paths, tokens_tree   forward-backward tokens of one step
    token_ratio                 tokens_paths / tokens_tree
    step_s_paths, step_s_tree   seconds of one step
    speedup                     step_s_paths / step_s_tree
    cpu_s_*, speedup_cpu        the same in CPU seconds of the process (steadier on a shared machine)
    grad_max_rel_diff           max |g_paths - g_tree| / max |g_paths| of the step (the layouts must
                                give the same gradient; float32 rounding only)

Top-level figures are medians over all steps of all families; `families` has the medians per
family. Goal (issue 18): token_ratio >= 2 and speedup >= 1.5 on the Appendix-C-shaped trees;
`goal_met_appendix_c` says whether this run met it. The regime is a CPU one (`regime`): a tiny
model, where attention over long rows is a large share of the work, so the speedup can exceed the
token ratio; on an accelerator with a large model the token ratio is the better guide.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench._tree_shapes import FAMILIES
from gyre.model.init import EMBEDDED_DEFAULT, init_model_dir
from gyre.model.weights import load_model
from gyre.rl.microstep import MicroStep
from gyre.rl.packing import pack
from gyre.rl.step_loss import train_microstep
from gyre.trajectory import TrajectoryTree, admit, materialize
from gyre.trajectory.materialize import RowLayout
from gyre.trajectory.row import TrajectoryRow

_J_MAX = 5
_BUDGET = 16384
"""Micro-step budget: above any execution's path tokens here, so nothing is trained in chunks."""


def _rows(trees: list[TrajectoryTree], layout: RowLayout, seed: int) -> list[TrajectoryRow]:
    return [
        r for k, t in enumerate(trees) for r in materialize(t, admit(t, j_max=_J_MAX, seed=seed + k), layout)
    ]


def _microsteps(trees: list[TrajectoryTree], layout: RowLayout, seed: int) -> list[MicroStep]:
    rows = _rows(trees, layout, seed)
    advantages = {t.execution_id: 1.0 + 0.5 * (k % 2) for k, t in enumerate(trees)}  # kept: s_i < 1 here
    return pack(rows, advantages, num_batch_executions=len(trees), token_budget=_BUDGET)


def _train(model: torch.nn.Module, steps: list[MicroStep]) -> tuple[float, float, torch.Tensor]:
    """(wall seconds, CPU seconds of this process, gradient) of one step."""
    model.zero_grad(set_to_none=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    for step in steps:
        train_microstep(step, model)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return elapsed, cpu, grads


def _measure(model: torch.nn.Module, trees: list[TrajectoryTree], seed: int, repeats: int) -> dict[str, Any]:
    steps = {layout: _microsteps(trees, layout, seed) for layout in ("paths", "tree")}
    times: dict[str, list[float]] = {"paths": [], "tree": []}
    cpu_times: dict[str, list[float]] = {"paths": [], "tree": []}
    *_, g_paths = _train(model, steps["paths"])  # warm-up, and the gradient check
    *_, g_tree = _train(model, steps["tree"])
    for _ in range(repeats):
        for layout in ("paths", "tree"):
            wall, cpu, _ = _train(model, steps[layout])
            times[layout].append(wall)
            cpu_times[layout].append(cpu)
    tokens = {layout: sum(s.num_tokens for s in steps[layout]) for layout in steps}
    step_s = {layout: statistics.median(times[layout]) for layout in times}
    cpu_s = {layout: statistics.median(cpu_times[layout]) for layout in cpu_times}
    return {
        "tokens_paths": tokens["paths"],
        "tokens_tree": tokens["tree"],
        "token_ratio": tokens["paths"] / tokens["tree"],
        "step_s_paths": step_s["paths"],
        "step_s_tree": step_s["tree"],
        "speedup": step_s["paths"] / step_s["tree"],
        "cpu_s_paths": cpu_s["paths"],
        "cpu_s_tree": cpu_s["tree"],
        "speedup_cpu": cpu_s["paths"] / cpu_s["tree"],
        "grad_max_rel_diff": float((g_paths - g_tree).abs().max() / g_paths.abs().max()),
        "rows_paths": sum(s.num_rows for s in steps["paths"]),
        "rows_tree": sum(s.num_rows for s in steps["tree"]),
        "oversize_microsteps": sum(s.oversize for layout in steps for s in steps[layout]),
    }


def _medians(results: list[dict[str, Any]]) -> dict[str, float]:
    keys = (
        "tokens_paths", "tokens_tree", "token_ratio", "step_s_paths", "step_s_tree", "speedup",
        "cpu_s_paths", "cpu_s_tree", "speedup_cpu",
    )  # fmt: skip
    out: dict[str, float] = {k: statistics.median(r[k] for r in results) for k in keys}
    out["grad_max_rel_diff"] = max(r["grad_max_rel_diff"] for r in results)
    return out


def _round(values: dict[str, Any]) -> dict[str, Any]:
    """Four significant digits (the gradient difference is ~1e-6)."""
    return {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in values.items()}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench tree-train")
    parser.add_argument("--steps", type=int, default=3, help="training steps measured per family")
    parser.add_argument("--executions", type=int, default=2, help="executions per step")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per step and layout (median kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="executions of 30%% of the calls, a one-layer model (smoke run)"
    )
    parser.add_argument("--json", action="store_true", help="accepted: the last line is always JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dims = {**EMBEDDED_DEFAULT, "num_hidden_layers": 1} if args.quick else EMBEDDED_DEFAULT
    with tempfile.TemporaryDirectory(prefix="gyre-bench-tree-train-") as tmp:
        path = init_model_dir(
            Path(tmp) / "model",
            arch="llama",
            tokenizer="byte",
            family="chatml",
            seed=args.seed,
            overrides=dims,
        )
        model = load_model(path).train()
    arch = model.arch
    num_params = sum(p.numel() for p in model.parameters())
    per_family: dict[str, list[dict[str, Any]]] = {}
    for name, make in FAMILIES.items():
        for step in range(args.steps):
            first = args.seed * 1000 + step * args.executions
            trees = [make(first + k, scale=0.3 if args.quick else 1.0) for k in range(args.executions)]
            result = _measure(model, trees, seed=first, repeats=args.repeats)
            per_family.setdefault(name, []).append(result)
            print(f"{name} step {step}: {json.dumps(_round(result))}", file=sys.stderr, flush=True)
    families = {name: _round(_medians(results)) for name, results in per_family.items()}
    overall = _medians([r for results in per_family.values() for r in results])
    appendix_c = families["appendix_c"]
    print(
        json.dumps(
            {
                **_round(overall),
                "families": families,
                "goal_met_appendix_c": appendix_c["token_ratio"] >= 2.0 and appendix_c["speedup"] >= 1.5,
                "regime": (
                    f"CPU ({platform.machine()}, torch {torch.__version__}, {args.threads} thread(s)); "
                    f"the embedded default's model ({arch.architecture}, {arch.num_layers} layers x "
                    f"d={arch.hidden_size}, {arch.num_heads} heads, ffn {arch.intermediate_size}; "
                    f"{num_params / 1e6:.2f} M parameters), float32, random init"
                ),
                "j_max": _J_MAX,
                "steps_per_family": args.steps,
                "executions_per_step": args.executions,
                "repeats": args.repeats,
                "quick": args.quick,
            }
        )
    )
