"""Synthetic packed micro-steps for any model, and the megatron backend's training throughput.

`synthetic_microsteps` makes a batch the way a live run would see it: 1..3 rows per execution sharing
a prefix, about half of each row's suffix as targets, behaviour log-probs equal to the model's own
plus a little noise (token ratios near 1, the sequence clip sometimes fires), group-relative
advantages, packed by the real packer (`gyre.rl.stream.StreamPacker`), so every target carries
1/(L_i·B·N). The model enters only through `row_logprobs(tokens) -> log π(token_t | tokens_<t)`.

`benchmark_microsteps` times `accumulate` over such a batch plus one optimizer step, for
`gyre bench train --backend megatron`:

    result = benchmark_microsteps(trainer, steps)      # {"microsteps_per_s": ..., "tokens_per_s": ...}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gyre.rl.advantages import MemberOutcome, MemberStatus, group_advantages
from gyre.rl.microstep import MicroStep
from gyre.rl.stream import StreamPacker
from gyre.trainer.backends.base import TrainerBackend
from gyre.trajectory.row import TrajectoryRow

RowLogprobs = Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]]
"""tokens [L] → [L] log-probs of each token given the ones before it (entry 0 unused)."""


def _rows(
    rng: np.random.Generator,
    row_logprobs: RowLogprobs,
    execution_id: str,
    vocab_size: int,
    min_len: int,
    max_len: int,
    noise: float,
) -> list[TrajectoryRow]:
    first = rng.integers(0, vocab_size, size=int(rng.integers(min_len, max_len + 1)))
    rows: list[TrajectoryRow] = []
    for j in range(int(rng.integers(1, 4))):
        if j == 0:
            tokens, shared = first, max(1, len(first) // 3)
        else:
            shared = int(rng.integers(1, len(first)))
            suffix = rng.integers(0, vocab_size, size=int(rng.integers(2, max(3, max_len - shared) + 1)))
            tokens = np.concatenate([first[:shared], suffix])[:max_len]
        targets = rng.random(len(tokens)) < 0.5
        targets[:shared] = False
        targets[0] = False
        behaviour = row_logprobs(tokens.astype(np.int64)) + rng.normal(0.0, noise, size=len(tokens))
        rows.append(
            TrajectoryRow(
                execution_id=execution_id,
                trajectory_index=j,
                leaf_class="main" if j == 0 else "sub_agent",
                token_ids=tokens.astype(np.int32),
                target_mask=targets,
                behaviour_logprobs=np.where(targets, behaviour, 0.0).astype(np.float32),
                policy_versions=np.where(targets, 0, -1).astype(np.int32),
            )
        )
    return rows


def synthetic_microsteps(
    row_logprobs: RowLogprobs,
    *,
    vocab_size: int,
    batch_id: str = "b0",
    step: int = 0,
    num_groups: int = 2,
    group_size: int = 4,
    token_budget: int = 256,
    min_row_tokens: int = 8,
    max_row_tokens: int = 64,
    noise: float = 0.01,
    seed: int = 0,
) -> list[MicroStep]:
    """The micro-steps of one batch of `num_groups` × `group_size` executions, in stream order."""
    rng = np.random.default_rng(seed)
    stream = StreamPacker(
        batch_id=batch_id, step=step, num_batch_executions=num_groups * group_size, token_budget=token_budget
    )
    steps: list[MicroStep] = []
    for g in range(num_groups):
        members = [
            MemberOutcome(f"g{g}e{k}", MemberStatus.VALID, float(rng.random())) for k in range(group_size)
        ]
        advantages = group_advantages(members).advantages
        rows = [
            row
            for m in members
            for row in _rows(
                rng, row_logprobs, m.execution_id, vocab_size, min_row_tokens, max_row_tokens, noise
            )
        ]
        steps.extend(stream.add(rows, advantages))
    steps.extend(stream.close())
    return steps


def benchmark_microsteps(
    trainer: TrainerBackend, steps: Sequence[MicroStep], *, repeats: int = 1, optimizer_step: bool = True
) -> dict[str, Any]:
    """Micro-steps/s and tokens/s of `accumulate` over `steps` (`repeats` passes, weights frozen), then
    the seconds of one optimizer step (core only: `optimizer_step=False` on a satellite). Works for any
    `TrainerBackend`, so the torch backend can be measured in the same run. Call on every TP rank."""
    if not steps:
        raise ValueError("benchmark_microsteps needs at least one micro-step")
    trainer.zero_grads()
    trainer.accumulate(steps[0])  # warm-up: first-call allocations and rotary caches
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
