"""`gyre bench r3`: routing replay (R3) on a tiny Qwen3-MoE — the embedded engine samples in bfloat16,
the torch trainer scores in float32, with and without replaying the engine's experts.

    gyre bench r3 [--steps 2] [--executions 4] [--calls 3] [--threads 1] [--json]

Per mode (`replay`, `free`), from the same initial weights and seeds: `--steps` optimizer steps, each
on `--executions` multi-turn executions of `--calls` model calls. Every call goes to a real embedded
engine (`model` output source, bfloat16, prefix cache on) with `return_routed_experts`, and is
recorded with `TrajectoryTree.prepare`/`commit` as the proxy records it (routing spread over the tree,
`gyre.trajectory.routing`); the trees are admitted, materialized as tree rows and packed
(`gyre.rl.packing.pack`, through the micro-step codec), and a float32 `TorchTrainer` with
`routing_replay` on or off takes the step, whose weights then go back to the engine. Per step:

    routing_agreement_tokens       tokens whose experts (every MoE layer) the trainer's forward chose
                                   as the engine did, over the tokens whose routing the engine returned
    routing_agreement_layer_tokens the same per (token, layer)
    mismatch_kl_token_mean         the trainer's k3 KL to the engine's recorded log-probs per target
                                   (`gyre.rl.loss_metrics`), and the other mismatch fields of the step

The last line is one JSON object: {"replay": {...}, "free": {...}} with the per-step lists and their
means. The regime is a CPU one (a random tiny model: routers close to uniform, so bfloat16 flips
many choices).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gyre.config.engine import EngineSection
from gyre.config.training import TrainerSection
from gyre.engine import EngineClient
from gyre.model.init import init_model_dir
from gyre.model.routing import ExpertRouting
from gyre.model.weights import load_model
from gyre.rl.codec import decode_microstep, encode_microstep
from gyre.rl.loss import ObjectiveParams
from gyre.rl.microstep import MicroStep
from gyre.rl.packing import pack
from gyre.trainer.backends import TrainerSpec, create_trainer
from gyre.trainer.backends.torch_backend import TorchTrainer
from gyre.trajectory import (
    CallMeta,
    Message,
    ModelRequest,
    TrajectoryTree,
    admit,
    get_profile,
    materialize,
    template_for_family,
)
from gyre.trajectory.messages import Api
from services.cell_agent.engine import EngineServer

_MAX_NEW_TOKENS = 24


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     \n") for _ in range(n))


async def _record(
    client: EngineClient, step: int, executions: int, calls: int, seed: int
) -> list[TrajectoryTree]:
    """`executions` trees of `calls` calls each, sampled by the engine and recorded as the proxy does."""
    template = template_for_family("chatml")
    trees = []
    for e in range(executions):
        rng = random.Random(seed * 1000 + step * 100 + e)
        tree = TrajectoryTree(f"exec-{step}-{e}", template, get_profile("generic"))
        messages = [Message.text("user", "Task: " + _text(rng, 80))]
        for c in range(calls):
            request = ModelRequest(Api.ANTHROPIC, ("You are a tiny model.",), tuple(messages), ())
            prepared = tree.prepare(request)
            params = {"temperature": 1.0, "max_new_tokens": _MAX_NEW_TOKENS, "stop_token_ids": [258]}
            result = await client.generate(
                prepared.input_ids, params, rid=f"s{step}-e{e}-c{c}", return_routed_experts=True
            )
            meta = CallMeta(request_id=f"c{c}", policy_version=step)
            try:
                committed = tree.commit(
                    prepared,
                    result.output_ids,
                    result.output_logprobs,
                    meta,
                    routed_experts=result.routed_experts,
                )
            except ValueError:  # a random model's bytes that do not decode: the call is not recorded
                continue
            if committed.output is not None:
                messages += [committed.output.to_message(), Message.text("user", "Result: " + _text(rng, 40))]
        trees.append(tree)
    return trees


def _microsteps(trees: list[TrajectoryTree], step: int) -> list[MicroStep]:
    rows = [r for k, t in enumerate(trees) for r in materialize(t, admit(t, j_max=5, seed=k), "tree")]
    advantages = {t.execution_id: (1.0 if k % 2 else -1.0) for k, t in enumerate(trees)}
    steps = pack(rows, advantages, num_batch_executions=len(trees), token_budget=1 << 20, step=step)
    return [decode_microstep(encode_microstep(s)) for s in steps]


def _agreement(trainer: TorchTrainer, steps: list[MicroStep], replay: bool) -> tuple[float, float, int]:
    """(token agreement, (token, layer) agreement, tokens compared) of the trainer's routing with the engine's."""
    moe = trainer.model.arch.moe
    assert moe is not None
    layers, k = trainer.model.arch.num_layers, moe.num_experts_per_tok
    same_tokens = same_pairs = num_tokens = 0
    for step in steps:
        assert step.routed_experts is not None
        recorded = torch.as_tensor(step.routed_experts, dtype=torch.int64).view(-1, layers, k)
        routing = ExpertRouting(replay=recorded if replay else None)
        with torch.no_grad():
            trainer.model(
                torch.as_tensor(step.input_ids, dtype=torch.int64),
                torch.as_tensor(step.position_ids, dtype=torch.int64),
                torch.as_tensor(step.cu_seqlens),
                step.tree,
                routing=routing,
            )
        chosen = routing.stacked(layers, k).long()
        known = (recorded >= 0).any(dim=-1).all(dim=-1)
        equal = (chosen.sort(dim=-1).values == recorded.sort(dim=-1).values).all(dim=-1)[known]
        same_tokens += int(equal.all(dim=-1).sum())
        same_pairs += int(equal.sum())
        num_tokens += int(known.sum())
    return same_tokens / max(num_tokens, 1), same_pairs / max(num_tokens * layers, 1), num_tokens


async def _mode(model_dir: Path, replay: bool, args: argparse.Namespace) -> dict[str, Any]:
    section = EngineSection(dtype="bfloat16", kv_cache_tokens=16384, enable_prefix_cache=True)
    trainer_section = TrainerSection(dtype="float32", routing_replay=replay, lr=1e-3)
    trainer = create_trainer("torch", TrainerSpec(trainer_section, model_dir, ObjectiveParams(), True))
    assert isinstance(trainer, TorchTrainer)
    steps_out: list[dict[str, Any]] = []
    async with (
        EngineServer(section, model_dir=model_dir, model=load_model(model_dir)) as server,
        EngineClient(server.url, timeout_s=600) as client,
    ):
        for step in range(args.steps):
            trees = await _record(client, step, args.executions, args.calls, args.seed)
            microsteps = _microsteps(trees, step)
            tokens, pairs, compared = _agreement(trainer, microsteps, replay)
            trainer.zero_grads()
            metrics = None
            for ms in microsteps:
                result = trainer.accumulate(ms)
                metrics = result.metrics if metrics is None else metrics.merge(result.metrics)
            assert metrics is not None
            summary = metrics.summary()
            trainer.optimizer_step()
            await client.update_weights_from_tensor(
                trainer.named_weights(), weight_version=str(step + 1), encoding="safetensors"
            )
            row = {
                "step": step,
                "routing_agreement_tokens": tokens,
                "routing_agreement_layer_tokens": pairs,
                "routed_tokens_compared": compared,
                "num_target_tokens": int(sum(ms.num_targets for ms in microsteps)),
                **{k: v for k, v in summary.items() if k.startswith("mismatch")},
            }
            print(json.dumps(row), file=sys.stderr)
            steps_out.append(row)
    keys = ("routing_agreement_tokens", "routing_agreement_layer_tokens", "mismatch_kl_token_mean")
    return {"steps": steps_out, **{f"{k}_mean": float(np.mean([s[k] for s in steps_out])) for k in keys}}


def run(args: argparse.Namespace, model_dir: Path | None = None) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="gyre-r3-") as tmp:
        if model_dir is None:
            model_dir = init_model_dir(
                Path(tmp) / "qwen3-moe-tiny", arch="qwen3_moe", size="tiny", tokenizer="byte", family="chatml"
            )
        out = {
            "model": "qwen3_moe tiny (4 layers, 8 experts, top-2), byte tokenizer",
            "engine_dtype": "bfloat16",
            "trainer_dtype": "float32",
            "num_steps": args.steps,
            "executions": args.executions,
            "calls": args.calls,
        }
        for mode, replay in (("replay", True), ("free", False)):
            out[mode] = asyncio.run(_mode(model_dir, replay, args))
    out["mismatch_kl_ratio_replay_over_free"] = (
        out["replay"]["mismatch_kl_token_mean_mean"] / out["free"]["mismatch_kl_token_mean_mean"]
    )
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gyre bench r3")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per mode")
    parser.add_argument("--executions", type=int, default=4, help="executions per step")
    parser.add_argument("--calls", type=int, default=3, help="model calls per execution")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="accepted: the last line is always JSON")
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    print(json.dumps(run(parse(argv))))
