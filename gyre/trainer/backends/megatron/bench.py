"""Training throughput of one trainer backend in this process: `accumulate` over a batch of
micro-steps (e.g. `gyre.trainer.synthetic.synthetic_microsteps`) plus one optimizer step, for
`gyre bench train --backend megatron` (which measures the torch backend on the same micro-steps in
the same run) and `gyre bench gpu`.

    result = benchmark_microsteps(trainer, steps)      # {"microsteps_per_s": ..., "tokens_per_s": ...}
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from gyre.rl.microstep import MicroStep
from gyre.trainer.backends.base import TrainerBackend


def benchmark_microsteps(
    trainer: TrainerBackend, steps: Sequence[MicroStep], *, repeats: int = 1, optimizer_step: bool = True
) -> dict[str, Any]:
    """Micro-steps/s and tokens/s of `accumulate` over `steps` (`repeats` passes, weights frozen), then
    the seconds of one optimizer step, the trainer's first (core only: `optimizer_step=False` on a
    satellite). Works for any `TrainerBackend`, so the torch backend can be measured in the same run.
    Call on every TP rank.

    One untimed pass over every micro-step first: each packed layout is a new shape, and the first
    call with a shape pays for allocations, rotary caches and, on CUDA, the attention kernels' plans
    (the first GPU run timed megatron's first pass at 505 ms a micro-step against 41.5 ms the next,
    with a warm-up of one micro-step only)."""
    if not steps:
        raise ValueError("benchmark_microsteps needs at least one micro-step")
    trainer.zero_grads()
    for s in steps:  # warm-up: every shape once
        trainer.accumulate(s)
    trainer.zero_grads()
    start = time.perf_counter()
    for _ in range(repeats):
        for s in steps:
            trainer.accumulate(s)
    accumulate_s = time.perf_counter() - start
    num_steps = repeats * len(steps)
    num_tokens = repeats * sum(s.num_tokens for s in steps)
    result: dict[str, Any] = {
        "backend": trainer.name,
        "num_microsteps": num_steps,
        "num_tokens": num_tokens,
        "accumulate_s": accumulate_s,
        "microsteps_per_s": num_steps / accumulate_s,
        "tokens_per_s": num_tokens / accumulate_s,
    }
    if optimizer_step:
        start = time.perf_counter()
        trainer.optimizer_step()
        result["optimizer_step_s"] = time.perf_counter() - start
    return result
