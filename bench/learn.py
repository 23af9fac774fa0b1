"""`gyre bench learn`: the learning gate at demo length, the held-out score before and after training,
over several run seeds.

Each seed runs the full demo (`gyre demo` machinery, `--steps` optimizer steps on the demo's training
tasks) and scores the held-out pool (`tasks.held_out`, never dispatched) at step 0 and at the last step
with the same engine seed and sample count (gyre/demo/heldout.py). Step 0 is the same model for every
seed, so `eval_first` is one number repeated; the seed-to-seed spread of `rise_per_seed` is the noise a
margin has to clear. A gate "rise > margin" has a false-alarm rate of the share of seeds below it.

Last line: {"seeds", "steps", "eval_first", "eval_last", "rise_per_seed", "rise_median", "rise_min",
"rise_std", "wall_s_per_seed", ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench learn", description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", default="0,1,2", help="run seeds, comma-separated")
    parser.add_argument("--config", default=None, help="YAML overlaid on the demo settings")
    parser.add_argument("--json", action="store_true", help="(the last line is JSON either way)")
    args = parser.parse_args(argv)

    from gyre.demo.config import demo_config
    from gyre.demo.run import DemoRun

    seeds = [int(s) for s in args.seeds.split(",")]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    first: list[float | None] = []
    last: list[float | None] = []
    wall: list[float] = []
    for seed in seeds:
        overrides: dict[str, Any] = {
            "run": {"id": f"bench-learn-{seed}-{stamp}"},
            "scheduler": {"seed": seed},
            "tasks": {"held_out_every_steps": args.steps},
        }
        config = demo_config(Path(args.config) if args.config else None, overrides)
        if not config.tasks.held_out:
            raise SystemExit("gyre bench learn: the config has no tasks.held_out pool to evaluate")
        t0 = time.monotonic()
        summary = DemoRun(config, steps=args.steps).execute(
            progress=lambda st, s, seed=seed: print(
                f"[seed {seed} {s:5.0f}s] step {st.steps}/{args.steps}", file=sys.stderr
            )
        )
        wall.append(round(time.monotonic() - t0, 1))
        by_step = summary["eval_by_step"]
        first.append(by_step[0]["mean_reward"])
        last.append(by_step[-1]["mean_reward"])
        print(
            json.dumps(
                {
                    "seed": seed,
                    "eval_by_step": [(e["step"], e["mean_reward"]) for e in by_step],
                    "train_reward_by_step": summary["reward_by_step"],
                }
            ),
            file=sys.stderr,
        )
    rises = [round(b - a, 4) for a, b in zip(first, last, strict=True) if a is not None and b is not None]
    print(
        json.dumps(
            {
                "seeds": seeds,
                "steps": args.steps,
                "eval_first": first,
                "eval_last": last,
                "rise_per_seed": rises,
                "rise_median": statistics.median(rises) if rises else None,
                "rise_min": min(rises) if rises else None,
                "rise_std": statistics.stdev(rises) if len(rises) > 1 else None,
                "wall_s_per_seed": wall,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
