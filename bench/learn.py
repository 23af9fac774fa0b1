"""`gyre bench learn`: the learning gate at demo length, the held-out score before and after training, per
scheduling mode over the same seeds at one matched staleness.

    gyre bench learn --json                                   # elastic (the demo's settings), seeds 0,1,2
    gyre bench learn --modes elastic,async,colocate --json    # is learning traded for speed?
    gyre bench learn --corrections tis,mis,icepop,seqmask --json   # the mismatch corrections (issue 39)

Each (mode, seed) runs the full demo (`gyre demo` machinery, `--steps` optimizer steps on the demo's
training tasks) and scores the held-out pool (`tasks.held_out`, never dispatched) at step 0 and at the
last step with the same engine seed and sample count (app/demo/heldout.py). The modes run at the demo's
target staleness E[d] = φ + (μ − 1)/2 (`mode_config`, as `gyre demo --mode` and `gyre bench e2e`): async
(E[d], 1) with one training cell, colocate (0, 2·E[d] + 1), elastic as configured. Step 0 is the same
model for every run, so `eval_first` is one number repeated; the seed-to-seed spread of `rise_per_seed` is
the noise any difference between the modes has to clear.

`--corrections` runs every mode once per objective correction (`CORRECTIONS`: the paper's token TIS, masked
IS, IcePop, the sequence-level geometric-mean mask; each with its default bounds in `objective`), over the
same seeds; an elastic run is off-policy by its staleness, so the corrections see ratios away from 1.

Last line: {"seeds", "steps", "target_staleness", "modes": {MODE: {"phi", "mu", "eval_first", "eval_last",
"rise_per_seed", "rise_median", "rise_min", "rise_std", "mean_staleness_per_seed", "wall_s_per_seed"}}}
and, for the first mode, its fields at the top level too (what a single-mode run printed before); `modes`
is the first correction's, and with `--corrections` "corrections": {NAME: {"objective", "modes": {MODE: ...}}}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

CORRECTIONS: dict[str, dict[str, Any]] = {
    "tis": {},
    "mis": {"token_correction": "mis"},
    "icepop": {"token_correction": "icepop"},
    "seqmask": {"sequence_mask": True},
}
"""`--corrections` names → the `objective` overrides of each (the rest of the objective as configured)."""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench learn", description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", default="0,1,2", help="run seeds, comma-separated")
    parser.add_argument("--modes", default="elastic", help="scheduling modes, comma-separated")
    parser.add_argument(
        "--corrections",
        default="tis",
        help=f"objective corrections, comma-separated: {', '.join(CORRECTIONS)}",
    )
    parser.add_argument("--config", default=None, help="YAML overlaid on the demo settings")
    parser.add_argument(
        "--uid-base",
        type=int,
        default=196000,
        help="first sandbox uid of the runner (the verifier's: +1000); another stack on the machine must not share them",
    )
    parser.add_argument("--json", action="store_true", help="(the last line is JSON either way)")
    args = parser.parse_args(argv)

    from app.demo.config import mode_config
    from gyre.config import ConfigError

    seeds = [int(s) for s in args.seeds.split(",")]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    corrections = [c.strip() for c in args.corrections.split(",") if c.strip()]
    unknown = [c for c in corrections if c not in CORRECTIONS]
    if unknown or not corrections:
        raise SystemExit(
            f"gyre bench learn: --corrections: unknown {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(CORRECTIONS)}"
        )
    file = Path(args.config) if args.config else None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out: dict[str, Any] = {"seeds": seeds, "steps": args.steps, "modes": {}}
    by_correction: dict[str, Any] = {}
    for mode in modes:  # every configuration is checked before the first run starts
        for correction in corrections:
            try:
                probe = mode_config(file, {"objective": CORRECTIONS[correction]}, mode)
            except ConfigError as e:
                raise SystemExit(f"gyre bench learn: {e}") from None
            if not probe.tasks.held_out:
                raise SystemExit("gyre bench learn: the config has no tasks.held_out pool to evaluate")
    for correction in corrections:
        result: dict[str, Any] = {"objective": CORRECTIONS[correction], "modes": {}}
        for mode in modes:
            probe = mode_config(file, {"objective": CORRECTIONS[correction]}, mode)
            out["target_staleness"] = probe.scheduler.phi + (probe.scheduler.mu - 1) / 2
            runs = [_run(file, mode, seed, args, stamp, correction) for seed in seeds]
            result["modes"][mode] = {"phi": probe.scheduler.phi, "mu": probe.scheduler.mu, **_rise(runs)}
        by_correction[correction] = result
    out["modes"] = by_correction[corrections[0]]["modes"]
    if args.corrections != "tis":
        out["corrections"] = by_correction
    first = out["modes"][modes[0]]
    out.update({k: v for k, v in first.items() if k not in ("phi", "mu")})
    print(json.dumps(out))


def _run(
    file: Path | None, mode: str, seed: int, args: argparse.Namespace, stamp: str, correction: str
) -> dict[str, Any]:
    from app.demo.config import mode_config
    from app.demo.run import DemoRun

    overrides: dict[str, Any] = {
        "run": {"id": f"bench-learn-{mode}-{correction}-{seed}-{stamp}"},
        "objective": CORRECTIONS[correction],
        "scheduler": {"seed": seed},
        "tasks": {"held_out_every_steps": args.steps},
        "runner": {"sandbox": {"uid_base": args.uid_base}},
        "evaluator": {"sandbox": {"uid_base": args.uid_base + 1000}},
    }
    config = mode_config(file, overrides, mode)
    t0 = time.monotonic()
    summary = DemoRun(config, steps=args.steps).execute(
        progress=lambda st, s: print(
            f"[{mode} {correction} seed {seed} {s:5.0f}s] step {st.steps}/{args.steps}", file=sys.stderr
        )
    )
    by_step = summary["eval_by_step"]
    print(
        json.dumps(
            {
                "mode": mode,
                "correction": correction,
                "seed": seed,
                "eval_by_step": [(e["step"], e["mean_reward"]) for e in by_step],
                "train_reward_by_step": summary["reward_by_step"],
            }
        ),
        file=sys.stderr,
    )
    return {
        "first": by_step[0]["mean_reward"],
        "last": by_step[-1]["mean_reward"],
        "staleness": summary["mean_staleness"],
        "wall_s": round(time.monotonic() - t0, 1),
        # what the correction did: the trainer's own fractions, mean over the run's steps
        **{name: _mean(summary.get(f"{name}_by_step") or []) for name in FRACTIONS},
    }


FRACTIONS = ("clip_fraction", "token_mask_fraction", "sequence_mask_fraction")


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def _rise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rises = [
        round(r["last"] - r["first"], 4) for r in runs if r["first"] is not None and r["last"] is not None
    ]
    return {
        "eval_first": [r["first"] for r in runs],
        "eval_last": [r["last"] for r in runs],
        "rise_per_seed": rises,
        "rise_median": statistics.median(rises) if rises else None,
        "rise_min": min(rises) if rises else None,
        "rise_std": round(statistics.stdev(rises), 4) if len(rises) > 1 else None,
        "mean_staleness_per_seed": [r["staleness"] for r in runs],
        "wall_s_per_seed": [r["wall_s"] for r in runs],
        **{f"{name}_per_seed": [r[name] for r in runs] for name in FRACTIONS},
    }


if __name__ == "__main__":
    main(sys.argv[1:])
