"""Score model directories on a held-out task pool and print one JSON line per model, in the order given:
the demo's held-out evaluation, run by `gyre demo` as one subprocess for all its eval steps (the app does
not import the harness; one process pays the torch import and start-up once, not once per step).

    python -m harness.demo_model.heldout --model runs/demo/heldout/v00000000 runs/demo/heldout/v00000004 \
        --tasks add/2+2 add/4+1 --samples 4 --seed 0
    {"model": "runs/demo/heldout/v00000000", "mean_reward": 0.25, "rewards": {...}, "seconds": 3.0}
    {"model": "runs/demo/heldout/v00000004", "mean_reward": 0.375, "rewards": {"add/2+2": [0.0, 1.0, ...]}, ...}

Each task is sampled `--samples` times through the demo harness's protocol on an in-process engine (one
per model) seeded with `--seed` (harness/demo_model/policy_eval.py): the same weights give the same
draws, so two evaluations differ only by what training changed. A model that cannot be scored gets
`{"model", "mean_reward": null, "error"}` and the next one is scored.
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
    p.add_argument("--model", type=Path, nargs="+", required=True, help="HF model directories")
    p.add_argument("--tasks", nargs="+", required=True, help="held-out task ids")
    p.add_argument("--samples", type=int, default=4, help="samples per task")
    p.add_argument("--seed", type=int, default=0, help="engine seed")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    args = p.parse_args(argv)
    if args.samples < 1:
        p.error("--samples must be at least 1")
    for model in args.model:
        t0 = time.monotonic()
        try:
            report = asyncio.run(
                measure_reward(
                    model,
                    list(args.tasks),
                    args.samples,
                    seed=args.seed,
                    concurrency=8,
                    temperature=args.temperature,
                )
            )
        except Exception as e:  # this model's line says why; the next models are still scored
            failed = {"model": str(model), "mean_reward": None, "error": f"{type(e).__name__}: {e}"[:500]}
            print(json.dumps(failed), flush=True)
            continue
        rewards = {t: report.rewards[t] for t in args.tasks}
        line = {
            "model": str(model),
            "mean_reward": report.mean_reward,
            "rewards": rewards,
            "seconds": round(time.monotonic() - t0, 3),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
