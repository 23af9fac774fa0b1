"""Score one model directory on a held-out task pool and print one JSON line: the demo's held-out
evaluation, run by `gyre demo` as a subprocess (the app does not import the harness).

    python -m harness.demo_model.heldout --model runs/demo/heldout/v00000004 --tasks add/2+2 add/4+1 \
        --samples 4 --seed 0
    {"mean_reward": 0.375, "rewards": {"add/2+2": [0.0, 1.0, 0.5, 0.0], ...}, "seconds": 3.1}

Each task is sampled `--samples` times through the demo harness's protocol on an in-process engine
seeded with `--seed` (harness/demo_model/policy_eval.py): the same weights give the same draws, so two
evaluations differ only by what training changed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from harness.demo_model.policy_eval import measure_reward


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m harness.demo_model.heldout", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", type=Path, required=True, help="an HF model directory")
    p.add_argument("--tasks", nargs="+", required=True, help="held-out task ids")
    p.add_argument("--samples", type=int, default=4, help="samples per task")
    p.add_argument("--seed", type=int, default=0, help="engine seed")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    args = p.parse_args(argv)
    if args.samples < 1:
        p.error("--samples must be at least 1")
    t0 = time.monotonic()
    report = asyncio.run(
        measure_reward(
            args.model,
            list(args.tasks),
            args.samples,
            seed=args.seed,
            concurrency=8,
            temperature=args.temperature,
        )
    )
    rewards = {t: report.rewards[t] for t in args.tasks}
    print(
        json.dumps(
            {
                "mean_reward": report.mean_reward,
                "rewards": rewards,
                "seconds": round(time.monotonic() - t0, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
