"""Warm start of the embedded model on teacher transcripts of the demo tasks.

    python -m harness.warmstart --out harness/checkpoints/warmstart.safetensors --seconds 480 --threads 2

Trains GyreLM (the `model` config section's shape, here the defaults) from a seeded random init on
transcripts of a mostly-right teacher (harness/teacher.py: 80% right, 10% wrong, 10% malformed
`write_file` calls), rendered through the exact path the proxy uses, with the loss on the
engine-sampled tokens only. It runs for a wall-clock budget, not a step count, so the result
depends on the machine; the shipped checkpoint records its steps and tokens in its metadata. It is
saved as fp16 safetensors (about 1.8 MB) by `gyre.model.checkpoint.save_checkpoint`, loadable by
the engine and the trainer. Then it measures the reward the checkpoint gets on the demo tasks
(harness/policy_eval.py) and prints one JSON line.

Why this shape (shared/FACTS.md, "Learning on CPU"): a warm start from a mostly-right teacher leaves
the model imperfect but well-formed, so groups of samples disagree and RL has signal at step 0.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gyre.config.model import ModelSection
from gyre.model.checkpoint import load_checkpoint, save_checkpoint
from gyre.model.config import ModelConfig
from gyre.model.transformer import GyreLM, build_model
from gyre.trajectory.templates import EmbeddedTemplate
from harness.tasks import TaskRegistry, demo_task_ids
from harness.teacher import render_transcript, teacher_body

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "warmstart.safetensors"
MULTI_PART_SHARE = 0.1
"""Share of teacher transcripts drawn from the multi-part suite (the rest: single additions)."""


def transcripts(seed: int) -> Iterator[tuple[list[int], list[bool]]]:
    """An endless seeded stream of rendered teacher transcripts over the demo tasks."""
    rng = random.Random(seed)
    registry, template = TaskRegistry(), EmbeddedTemplate()
    ids = demo_task_ids()
    singles = [t for t in ids if t.startswith("add/")]
    multi = [t for t in ids if not t.startswith("add/")]
    while True:
        pool = multi if multi and rng.random() < MULTI_PART_SHARE else singles
        yield render_transcript(teacher_body(registry.get(rng.choice(pool)), rng), template)


def packed_batch(stream: Iterator[tuple[list[int], list[bool]]], tokens_per_step: int) -> dict[str, torch.Tensor]:
    """Whole transcripts packed up to `tokens_per_step`: inputs, positions, boundaries, targets."""
    ids: list[int] = []
    positions: list[int] = []
    bounds = [0]
    predict_at: list[int] = []
    labels: list[int] = []
    while not predict_at or len(ids) < tokens_per_step:
        seq, targets = next(stream)
        offset = len(ids)
        for t in range(1, len(seq)):
            if targets[t]:
                predict_at.append(offset + t - 1)
                labels.append(seq[t])
        ids += seq
        positions += range(len(seq))
        bounds.append(len(ids))
    return {
        "input_ids": torch.tensor(ids),
        "position_ids": torch.tensor(positions),
        "cu_seqlens": torch.tensor(bounds),
        "predict_at": torch.tensor(predict_at),
        "labels": torch.tensor(labels),
    }


def lr_at(step: int, progress: float, peak: float, warmup_steps: int = 20) -> float:
    """Linear warmup, then cosine decay to 10% of `peak` over the wall-clock budget."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(seconds: float, seed: int = 0, lr: float = 3e-3, tokens_per_step: int = 4096, threads: int = 1,
          config: ModelConfig | None = None, log_every: int = 25) -> tuple[GyreLM, dict[str, Any]]:
    """Train for `seconds` of wall clock; returns the model and training stats.

    One torch thread by default: on a machine whose cores are shared (CI, the demo's own services),
    two threads that get preempted stall each other and train several times slower than one."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(seconds, seed, lr, tokens_per_step, threads, config, log_every)
    finally:
        torch.set_num_threads(previous_threads)


def _train(seconds: float, seed: int, lr: float, tokens_per_step: int, threads: int, config: ModelConfig | None,
           log_every: int) -> tuple[GyreLM, dict[str, Any]]:
    torch.manual_seed(seed)
    model = build_model(config or ModelConfig.from_section(ModelSection()), seed=seed).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    stream = transcripts(seed)
    start = time.monotonic()
    step, tokens, loss_ema = 0, 0, float("nan")
    while (elapsed := time.monotonic() - start) < seconds:
        batch = packed_batch(stream, tokens_per_step)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, elapsed / seconds, lr)
        logits = model(batch["input_ids"], batch["position_ids"], batch["cu_seqlens"])
        loss = torch.nn.functional.cross_entropy(logits[batch["predict_at"]].float(), batch["labels"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        tokens += int(batch["input_ids"].numel())
        value = float(loss.detach())
        loss_ema = value if math.isnan(loss_ema) else 0.9 * loss_ema + 0.1 * value
        if log_every and step % log_every == 0:
            print(f"warmstart: step {step} {elapsed:.0f}s loss {loss_ema:.4f} tokens {tokens}", flush=True)
    stats = {"steps": step, "tokens": tokens, "seconds": round(time.monotonic() - start, 1), "loss": round(loss_ema, 4),
             "seed": seed, "lr": lr, "threads": threads}
    return model.eval(), stats


def save_fp16(model: GyreLM, path: Path, stats: dict[str, Any]) -> Path:
    """fp16 safetensors (half the bytes; loads into the fp32 model exactly as the fp16 values)."""
    half = copy.deepcopy(model).half()
    return save_checkpoint(half, path, {"source": "harness.warmstart", **{k: str(v) for k, v in stats.items()}})


def ensure_checkpoint(path: Path = DEFAULT_CHECKPOINT, seconds: float = 480.0, seed: int = 0) -> Path:
    """The warm-start checkpoint at `path`, trained and written first when it is absent."""
    if not path.exists():
        model, stats = train(seconds, seed=seed)
        save_fp16(model, path, stats)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.warmstart", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_CHECKPOINT, help="checkpoint to write")
    parser.add_argument("--seconds", type=float, default=480.0, help="wall-clock training budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is robust on shared cores)")
    parser.add_argument("--tokens-per-step", type=int, default=4096)
    parser.add_argument("--eval-samples", type=int, default=8, help="samples per demo task (0 = no measurement)")
    parser.add_argument("--eval-only", type=Path, default=None, help="measure this checkpoint, train nothing")
    args = parser.parse_args(argv)
    if args.eval_only is not None:
        model, metadata = load_checkpoint(args.eval_only)
        report: dict[str, Any] = {"checkpoint": str(args.eval_only), **metadata}
    else:
        model, stats = train(args.seconds, seed=args.seed, lr=args.lr, tokens_per_step=args.tokens_per_step,
                             threads=args.threads)
        path = save_fp16(model, args.out, stats)
        model, _ = load_checkpoint(path)  # measure what was shipped (fp16 values), not the fp32 weights
        report = {"checkpoint": str(path), "bytes": path.stat().st_size, **stats}
    if args.eval_samples:
        from harness.policy_eval import measure_reward

        measured = asyncio.run(measure_reward(model, demo_task_ids(), args.eval_samples, seed=args.seed))
        report |= measured.summary()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
