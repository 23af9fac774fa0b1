"""`gyre bench e2e`: the three scheduling modes on the same stack and workload, one after another.

Each mode runs the full system (`gyre demo` machinery) for `--steps` optimizer steps on the demo
tasks with heavy-tailed tool-latency sleeps in the demo harness, so wall time measures scheduling,
not CPU. (φ, μ) are set for one matched target staleness E[d] = φ + (μ − 1)/2:

    elastic (E[d] − (μ_e − 1)/2, μ_e)   async (E[d], 1), T = 1 training cell   colocate (0, 2·E[d] + 1)

The defaults, E[d] = 1.5 and μ_e = 3, are the paper's Table 2 rows E0 (0.5, 3), A0 (1.5, 1) and
C0 (0, 4). `--config app/demo/sglang.yaml` runs the cells' engines on SGLang (each run names its
`engine`). The default tool sleeps (median 20 s, Pareto tail capped at 120 s) make executions mostly
wait, as agent executions do; with short sleeps the three modes are bound by the machine's two
cores, which every cell shares. The runner may run as many executions as the cells hold (K · C_e),
so the rollout capacity the policy plans with is the one it gets.

Last line: {"elastic_s", "async_s", "colocate_s", "speedup_vs_async", "speedup_vs_colocate", ...}:
wall time of each mode's whole `gyre demo` run (stack start and stop included); `runs.<mode>` adds
`scheduled_s` (first dispatch → last step: the part the simulator models), the run directory and the
machine's load. These are CPU-stack figures: K = 3 cells share this machine's cores, and training is
seconds against minutes of rollout, so they say nothing about a cluster's ratios. `gyre sim validate`
checks the simulator against exactly these runs (`--measured` takes this JSON), and `gyre sim ablation`
gives the cluster-scale ratios from that validated model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def mode_settings(target_staleness: float, elastic_mu: int = 3) -> dict[str, dict[str, Any]]:
    """(φ, μ) per mode at one target staleness (async with T = 1 training cell)."""
    from services.scheduler.policy import Mode
    from services.scheduler.policy.params import matched_phi_mu

    out: dict[str, dict[str, Any]] = {}
    for mode in Mode:
        phi, mu = matched_phi_mu(mode, target_staleness, elastic_mu)
        out[mode.value] = {"mode": mode.value, "phi": phi, "mu": mu}
    out["async"]["async_training_cells"] = 1
    return out


def scheduled_s(run_dir: Path, steps: int) -> float | None:
    """Seconds from the run's first dispatch to its `steps`-th completed step (from events.jsonl)."""
    first: float | None = None
    done: list[float] = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "gyre.v1.GroupDispatched" and first is None:
            first = event["time_s"]
        elif event["type"] == "gyre.v1.StepCompleted":
            done.append(event["time_s"])
    if first is None or len(done) < steps:
        return None
    return round(sorted(done)[steps - 1] - first, 1)


def _progress(mode: str, steps: int) -> Any:
    def show(state: Any, elapsed_s: float) -> None:
        print(f"[{mode} {elapsed_s:5.0f}s] step {state.steps}/{steps}", file=sys.stderr)

    return show


def main(argv: list[str]) -> None:
    print(json.dumps(measure(argv)))


def measure(argv: list[str]) -> dict[str, Any]:
    """Run the modes; the result `main` prints (also what `gyre sim validate` compares against)."""
    args = _parser().parse_args(argv)

    from app.demo.config import demo_config
    from app.demo.run import DemoRun

    config = Path(args.config) if args.config else None
    base = demo_config(config, {}).scheduler
    capacity = base.num_cells * base.cell_capacity + base.separate_pool_capacity
    results: dict[str, Any] = {}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in args.modes.split(","):
        cfg = demo_config(config, _overrides(args, name, f"bench-e2e-{name}-{stamp}", capacity))
        load_before = os.getloadavg()[0]
        t0 = time.monotonic()
        summary = DemoRun(cfg, steps=args.steps).execute(progress=_progress(name, args.steps))
        results[name] = {
            "wall_s": round(time.monotonic() - t0, 1),
            "summary": summary,
            "load": (load_before, os.getloadavg()[0]),
            "engine": cfg.cell_agent.engine.backend,
        }
    return _report(args, results)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gyre bench e2e", description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--target-staleness", type=float, default=1.5)
    parser.add_argument("--elastic-mu", type=int, default=3, help="steps per elastic burst")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tool-latency-s", type=float, default=20.0, help="median tool sleep of the harness")
    parser.add_argument("--tool-latency-max-s", type=float, default=120.0, help="cap of one tool sleep")
    parser.add_argument(
        "--tool-latency-alpha", type=float, default=1.5, help="Pareto shape of the tool sleeps"
    )
    parser.add_argument("--modes", default="elastic,async,colocate")
    parser.add_argument("--config", default=None, help="YAML overlaid on the demo settings")
    parser.add_argument(
        "--uid-base",
        type=int,
        default=192000,
        help="first sandbox uid of the runner (the verifier's: +1000); another stack on the machine must not share them",
    )
    return parser


def _overrides(args: argparse.Namespace, mode: str, run_id: str, capacity: int) -> dict[str, Any]:
    """The demo's settings for one mode's run, over its config."""
    return {
        "run": {"id": run_id},
        "scheduler": {**mode_settings(args.target_staleness, args.elastic_mu)[mode], "seed": args.seed},
        "runner": {
            "max_concurrent": capacity,
            # sandbox uids of its own: a runner kills every process of the uids it takes, and other
            # stacks and tests on this machine use the default ranges (runner 120000+, verifier 130000+)
            "sandbox": {"uid_base": args.uid_base},
            "harness_args": [
                "--tool-latency-s",
                str(args.tool_latency_s),
                "--tool-latency-max-s",
                str(args.tool_latency_max_s),
                "--tool-latency-alpha",
                str(args.tool_latency_alpha),
            ],
        },
        "evaluator": {"sandbox": {"uid_base": args.uid_base + 1000}},
    }


def _report(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    """Each mode's wall time, the speedups of elastic, and every run's figures."""
    out: dict[str, Any] = {f"{k}_s": v["wall_s"] for k, v in results.items()}
    if "elastic" in results:
        for other in ("async", "colocate"):
            if other in results:
                out[f"speedup_vs_{other}"] = round(results[other]["wall_s"] / results["elastic"]["wall_s"], 3)
    out.update(
        steps=args.steps,
        target_staleness=args.target_staleness,
        seed=args.seed,
        mean_staleness={k: v["summary"]["mean_staleness"] for k, v in results.items()},
        transitions={k: v["summary"]["transitions"]["count"] for k, v in results.items()},
        tool_latency={
            "median_s": args.tool_latency_s,
            "max_s": args.tool_latency_max_s,
            "alpha": args.tool_latency_alpha,
        },
        runs={
            k: {
                "wall_s": v["wall_s"],
                "scheduled_s": scheduled_s(Path(v["summary"]["run_dir"]), args.steps),
                "run_dir": str(Path(v["summary"]["run_dir"]).resolve()),
                "load_avg_1m": [round(x, 2) for x in v["load"]],
                "engine": v["engine"],
                **{key: v["summary"][key] for key in ("mode", "phi", "mu", "executions", "transitions")},
            }
            for k, v in results.items()
        },
        cpu_count=os.cpu_count(),
        regime="CPU stack: K cells share this machine's cores; not a cluster result (see gyre sim validate)",
    )
    return out
