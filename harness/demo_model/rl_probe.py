"""A short RL run on the demo tasks, on CPU, with this project's objective: does the warm-started
model improve?

    python -m harness.demo_model.rl_probe --checkpoint harness/demo_model/checkpoints/warmstart --steps 40

Each step samples `--tasks` demo tasks × `--samples` executions through the embedded engine with
the demo harness's protocol (harness/demo_model/policy_eval.py), computes group-relative advantages
(`gyre.rl.advantages`) and the GSPO-variant loss (`gyre.rl.loss`, coefficients 1/(L_i·B·N)) from
the engine's recorded behaviour log-probs, takes one AdamW step and loads the new weights into the
engine. A fixed evaluation (every demo task × `--eval-samples`, temperature 1) before and after
shows the trend more honestly than the noisy per-step batch reward. Prints one JSON line.

This is a measurement of the task suite and the warm start, not the distributed system: the
services (scheduler, proxy, packer, cells) run the same objective at scale in `gyre demo`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from gyre.config.engine import EngineSection
from gyre.engine.client import EngineClient
from gyre.model.causal_lm import CausalLM
from gyre.model.logprobs import token_logprobs
from gyre.model.weights import load_model
from gyre.rl.advantages import MemberReward, MemberStatus, group_advantages
from gyre.rl.loss import gspo_loss
from gyre.tasks import TaskRegistry, demo_task_ids
from gyre.trajectory.templates import template_for_family
from harness.demo_model.policy_eval import RewardReport, Rollout, rollout
from harness.demo_model.warmstart import DEFAULT_CHECKPOINT

MICRO_BATCH = 16
"""Executions per forward/backward (gradients accumulate; the coefficients make the sum exact)."""


async def sample_groups(
    client: EngineClient, task_ids: list[str], samples: int, tag: str
) -> dict[str, list[Rollout]]:
    registry, template = TaskRegistry(), template_for_family("chatml")
    groups: dict[str, list[Rollout]] = {t: [] for t in task_ids}

    async def one(task_id: str, k: int) -> None:
        groups[task_id].append(
            await rollout(client, registry.get(task_id), template, rid=f"{tag}/{task_id}#{k}")
        )

    await asyncio.gather(*(one(t, k) for t in task_ids for k in range(samples)))
    return groups


def policy_step(
    model: CausalLM, optimizer: torch.optim.Optimizer, groups: dict[str, list[Rollout]]
) -> dict[str, Any]:
    """One optimizer step of the GSPO-variant objective over the sampled groups."""
    num_executions = sum(len(g) for g in groups.values())
    executions: list[tuple[Rollout, float]] = []
    for task_id, members in groups.items():
        outcomes = [
            MemberReward(f"{task_id}#{k}", MemberStatus.VALID, r.reward) for k, r in enumerate(members)
        ]
        advantages = group_advantages(outcomes).advantages
        executions += [(r, advantages[o.execution_id]) for r, o in zip(members, outcomes, strict=True)]
    trained = [(r, a) for r, a in executions if a != 0.0 and any(r.targets)]
    optimizer.zero_grad(set_to_none=True)
    loss_total = 0.0
    for start in range(0, len(trained), MICRO_BATCH):
        chunk = trained[start : start + MICRO_BATCH]
        ids: list[int] = []
        positions: list[int] = []
        bounds = [0]
        predict_at: list[int] = []
        labels: list[int] = []
        behaviour: list[float] = []
        index: list[int] = []
        coefficients: list[float] = []
        for i, (r, _) in enumerate(chunk):
            offset = len(ids)
            num_targets = sum(r.targets)
            for t in range(1, len(r.ids)):
                if r.targets[t]:
                    predict_at.append(offset + t - 1)
                    labels.append(r.ids[t])
                    behaviour.append(r.behaviour_logprobs[t])
                    index.append(i)
                    coefficients.append(1.0 / (num_targets * num_executions))
            ids += r.ids
            positions += range(len(r.ids))
            bounds.append(len(ids))
        logits = model(torch.tensor(ids), torch.tensor(positions), bounds)
        logprobs = token_logprobs(logits[torch.tensor(predict_at)], torch.tensor(labels))
        loss, _ = gspo_loss(
            logprobs,
            torch.tensor(behaviour),
            torch.tensor([a for _, a in chunk]),
            torch.tensor(index),
            torch.tensor(coefficients, dtype=torch.float64).float(),
        )
        loss.backward()  # type: ignore[no-untyped-call]
        loss_total += float(loss.detach())
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)) if trained else 0.0
    if trained:
        optimizer.step()
    rewards = [r.reward for r, _ in executions]
    return {
        "batch_reward": statistics.fmean(rewards),
        "trained_executions": len(trained),
        "loss": loss_total,
        "grad_norm": grad_norm,
        "groups_with_variance": sum(len({r.reward for r in g}) > 1 for g in groups.values()) / len(groups),
    }


async def evaluate(client: EngineClient, pool: list[str], samples: int, tag: str) -> RewardReport:
    groups = await sample_groups(client, pool, samples, tag)
    return RewardReport({t: [r.reward for r in g] for t, g in groups.items()})


async def probe(
    checkpoint: Path,
    steps: int,
    tasks: int,
    samples: int,
    lr: float,
    eval_samples: int,
    seed: int,
    pool: list[str] | None = None,
) -> dict[str, Any]:
    pool = pool or demo_task_ids()
    torch.manual_seed(seed)
    model = load_model(checkpoint).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(seed)
    section = EngineSection(max_batch_size=64, seed=seed, num_threads=2)
    started = time.monotonic()
    from services.cell_agent.engine import EngineServer

    async with (
        EngineServer(section, model_dir=checkpoint, model=copy.deepcopy(model).eval()) as engine,
        EngineClient(engine.url, timeout_s=600) as client,
    ):
        before = await evaluate(client, pool, eval_samples, "eval0")
        history = []
        for step in range(steps):
            groups = await sample_groups(client, rng.sample(pool, tasks), samples, f"s{step}")
            stats = await asyncio.to_thread(policy_step, model, optimizer, groups)
            weights = {name: p.detach().clone() for name, p in model.named_parameters()}
            await engine.update_weights(weights, weight_version=str(step + 1))
            history.append({k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items()})
            print(f"rl_probe: step {step + 1} {json.dumps(history[-1])}", flush=True)
        after = await evaluate(client, pool, eval_samples, "eval1")
    return {
        "checkpoint": str(checkpoint),
        "steps": steps,
        "tasks_per_step": tasks,
        "samples_per_task": samples,
        "lr": lr,
        "eval_reward_start": round(before.mean_reward, 4),
        "eval_reward_end": round(after.mean_reward, 4),
        "groups_with_variance_step0": history[0]["groups_with_variance"] if history else None,
        "eval_groups_with_variance_start": round(before.groups_with_variance, 4),
        "batch_reward_first5": round(statistics.fmean(h["batch_reward"] for h in history[:5]), 4)
        if history
        else None,
        "batch_reward_last5": round(statistics.fmean(h["batch_reward"] for h in history[-5:]), 4)
        if history
        else None,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m harness.demo_model.rl_probe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--tasks", type=int, default=16, help="groups per step (B)")
    parser.add_argument("--samples", type=int, default=8, help="executions per group (N)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument(
        "--eval-samples", type=int, default=4, help="samples per demo task in the fixed evaluation"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pool", default="", help="task ids separated by ;  to draw from (default: the demo suite)"
    )
    args = parser.parse_args(argv)
    print(
        json.dumps(
            asyncio.run(
                probe(
                    args.checkpoint,
                    args.steps,
                    args.tasks,
                    args.samples,
                    args.lr,
                    args.eval_samples,
                    args.seed,
                    [t for t in args.pool.split(";") if t],
                )
            )
        )
    )


if __name__ == "__main__":
    main()
