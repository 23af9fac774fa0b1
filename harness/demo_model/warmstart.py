"""Warm start of the embedded demo model on teacher transcripts of the demo tasks.

    python -m harness.demo_model.warmstart --out harness/demo_model/checkpoints/warmstart --seconds 480 --threads 2

The demo model is a Hugging Face Llama directory at the embedded default's size (`DEMO_MODEL`: 4
layers, d=128, 0.9 M parameters, a byte tokenizer and Gyre's compact ChatML, `gyre.model.init`).
This trains it from a seeded random init on transcripts of a mostly-right teacher
(harness/demo_model/teacher.py: 80% right, 10% wrong, 10% malformed `write_file` calls), rendered through the
exact path the proxy uses, with the loss on the engine-sampled tokens only. It runs for a
wall-clock budget, not a step count, so the result depends on the machine; the directory records
its steps and tokens in the safetensors metadata. Weights are saved in fp16 (about 1.8 MB), an HF
directory the engine, the trainer and `transformers` load. Then it measures the reward the
checkpoint gets on the demo tasks (harness/demo_model/policy_eval.py) and prints one JSON line.

Why this shape (docs/facts.md, "Learning on CPU"): a warm start from a mostly-right teacher leaves
the model imperfect but well-formed, so groups of samples disagree and RL has signal at step 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gyre.model.causal_lm import CausalLM
from gyre.model.files import check_model_dir
from gyre.model.init import EMBEDDED_DEFAULT, init_model_dir
from gyre.model.weights import load_model, write_model_dir
from gyre.tasks import TaskRegistry, demo_task_ids
from gyre.trajectory.templates import template_for_family
from harness.demo_model.teacher import render_transcript, teacher_body

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "warmstart"
DEMO_MODEL = EMBEDDED_DEFAULT
"""config.json of the embedded demo model (a Llama; `gyre model init` with these overrides)."""
MULTI_PART_SHARE = 0.1
"""Share of teacher transcripts drawn from the multi-part suite (the rest: single additions)."""


def transcripts(seed: int) -> Iterator[tuple[list[int], list[bool]]]:
    """An endless seeded stream of rendered teacher transcripts over the demo tasks."""
    rng = random.Random(seed)
    registry, template = TaskRegistry(), template_for_family("chatml")
    ids = demo_task_ids()
    singles = [t for t in ids if t.startswith("add/")]
    multi = [t for t in ids if not t.startswith("add/")]
    while True:
        pool = multi if multi and rng.random() < MULTI_PART_SHARE else singles
        yield render_transcript(teacher_body(registry.get(rng.choice(pool)), rng), template)


def packed_batch(
    stream: Iterator[tuple[list[int], list[bool]]], tokens_per_step: int
) -> dict[str, torch.Tensor]:
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


def train(
    seconds: float,
    seed: int = 0,
    lr: float = 3e-3,
    tokens_per_step: int = 4096,
    threads: int = 1,
    base: Path | None = None,
    log_every: int = 25,
) -> tuple[CausalLM, dict[str, Any]]:
    """Train for `seconds` of wall clock; returns the model and training stats.

    One torch thread by default: on a machine whose cores are shared (CI, the demo's own services),
    two threads that get preempted stall each other and train several times slower than one.
    `base` is the model directory to start from (default: a fresh `DEMO_MODEL` init under `seed`)."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(seconds, seed, lr, tokens_per_step, threads, base, log_every)
    finally:
        torch.set_num_threads(previous_threads)


def init_demo_model(out: Path, seed: int = 0) -> Path:
    """A random-init demo model directory (fp16 weights, byte tokenizer, compact ChatML)."""
    return init_model_dir(
        out,
        arch="llama",
        size="tiny",
        seed=seed,
        tokenizer="byte",
        family="chatml",
        dtype="float16",
        overrides=DEMO_MODEL,
    )


def _train(
    seconds: float,
    seed: int,
    lr: float,
    tokens_per_step: int,
    threads: int,
    base: Path | None,
    log_every: int,
) -> tuple[CausalLM, dict[str, Any]]:
    torch.manual_seed(seed)
    if base is None:
        with tempfile.TemporaryDirectory(prefix="gyre-warmstart-") as scratch:
            model = load_model(init_demo_model(Path(scratch) / "init", seed)).train()
    else:
        model = load_model(base).train()
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
    stats = {
        "steps": step,
        "tokens": tokens,
        "seconds": round(time.monotonic() - start, 1),
        "loss": round(loss_ema, 4),
        "seed": seed,
        "lr": lr,
        "threads": threads,
    }
    return model.eval(), stats


def save_fp16(model: CausalLM, out: Path, stats: dict[str, Any]) -> Path:
    """An fp16 HF directory (half the bytes; loads into the fp32 model exactly as the fp16 values),
    with the training stats in the safetensors metadata."""
    metadata = {
        f"gyre_warmstart_{k}": str(v) for k, v in {"source": "harness.demo_model.warmstart", **stats}.items()
    }
    with tempfile.TemporaryDirectory(prefix="gyre-warmstart-") as scratch:
        files = init_demo_model(Path(scratch) / "files")  # the tokenizer and template files to ship with it
        return write_model_dir(
            out,
            arch=model.arch,
            tensors=dict(model.named_parameters()),
            source=files,
            metadata=metadata,
            dtype="float16",
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m harness.demo_model.warmstart", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_CHECKPOINT, help="model directory to write")
    parser.add_argument("--seconds", type=float, default=480.0, help="wall-clock training budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is robust on shared cores)")
    parser.add_argument("--tokens-per-step", type=int, default=4096)
    parser.add_argument(
        "--eval-samples", type=int, default=8, help="samples per demo task (0 = no measurement)"
    )
    parser.add_argument(
        "--eval-only", type=Path, default=None, help="measure this model directory, train nothing"
    )
    args = parser.parse_args(argv)
    if args.eval_only is not None:
        path = args.eval_only
        report: dict[str, Any] = {"checkpoint": str(path), **check_model_dir(path).metadata}
    else:
        model, stats = train(
            args.seconds,
            seed=args.seed,
            lr=args.lr,
            tokens_per_step=args.tokens_per_step,
            threads=args.threads,
        )
        path = save_fp16(model, args.out, stats)
        size = sum(f.stat().st_size for f in path.iterdir())
        report = {"checkpoint": str(path), "bytes": size, **stats}
    if args.eval_samples:
        from harness.demo_model.policy_eval import measure_reward

        # Measure what was shipped (the fp16 values), not the fp32 weights that were trained.
        measured = asyncio.run(measure_reward(path, demo_task_ids(), args.eval_samples, seed=args.seed))
        report |= measured.summary()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
