"""Benchmark of role switches on one cell: rollout → training with requests in flight, one training
step, training → rollout loading the newly published weights.

    gyre bench switch [--cycles 5] [--inflight 8] [--release-weights] [--backend embedded|sglang]

A real CellAgent (the embedded default's model unless `--model`, real Redis and NATS started for the
run; its engine the embedded one in-process, or with `--backend sglang` a real SGLang server it launches
with the demo's CPU settings, app/demo/sglang.yaml) is driven the way the scheduler drives it. Each cycle: `--inflight` long generations are
running; SwitchRole(TRAINING) hands them back (aborts them, counted), releases the KV cache (and the
engine's weights with `--release-weights`); a one-step batch is trained and published; then
SwitchRole(ROLLOUT, v) resumes memory, loads the published weights from disk and reports ready.
Times are the agent's own transition times (begin → ready), as reported in RoleTransitionCompleted.

    rollout_to_training_s_p50   median seconds of rollout → training   (goal < 1 s; paper 8.52 s, 122B)
    training_to_rollout_s_p50   median seconds of training → rollout   (goal < 1 s; paper 3.46 s, 122B)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import uuid
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.message import Message

from app.demo import config as demo_config
from app.demo.config import embedded_model_path
from app.stack.servers import start_nats, start_redis
from bench._startup import run_bench
from gyre.bus import EventBus
from gyre.config import load_config
from gyre.engine import EngineClient, EngineError
from gyre.model.model_dir import ModelDir
from gyre.rl.codec import encode_microstep
from gyre.roles import ROLLOUT, TRAINING
from gyre.store import Keys, WorkQueue, connect_redis
from gyre.trainer.backends import TorchTrainer
from gyre.trainer.synthetic import synthetic_microsteps
from services.cell_agent.agent import CellAgent
from services.cell_agent.engine_hosts import EngineHost


async def _in_flight(engine: EngineHost, n: int, timeout_s: float = 120.0) -> None:
    """Until the engine counts `n` requests in flight (SGLang's gauges trail by up to 40 decode steps)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await engine.num_in_flight() < n:
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"{n} requests never got in flight within {timeout_s} s")
        await asyncio.sleep(0.005)


def _engine_section(backend: str) -> dict[str, Any]:
    """The cell's engine: the embedded default, or SGLang as the demo's SGLang overlay sets it."""
    if backend == "embedded":
        return {}
    overlay = yaml.safe_load((Path(demo_config.__file__).parent / "sglang.yaml").read_text())
    return {"engine": overlay["cell_agent"]["engine"]}


async def _run(args: argparse.Namespace, root: Path, nats_url: str, redis_url: str) -> dict[str, float]:
    run_id = f"bench{uuid.uuid4().hex[:8]}"
    config = load_config(
        None,
        environ={},
        overrides={
            "run": {"id": run_id, "dir": str(root)},
            "model": {"path": str(args.model or embedded_model_path())},
            "nats": {"url": nats_url},
            "redis": {"url": redis_url},
            "scheduler": {"num_cells": 1},
            "cell_agent": {"release_engine_weights": args.release_weights, **_engine_section(args.backend)},
        },
    )
    redis = await connect_redis(redis_url)
    bus = await EventBus.connect(nats_url, run_id, "bench-switch")

    async def emit(event: Message, event_id: str) -> None:
        await bus.publish(event, event_id=event_id)

    agent = CellAgent(config, model=ModelDir.open(config.model), cell=0, redis=redis, emit=emit)
    await agent.start()
    await asyncio.gather(*await agent.background())
    to_training: list[float] = []
    to_rollout: list[float] = []
    handed_back = 0
    long = {"max_new_tokens": 2000, "ignore_eos": True, "temperature": 1.0}
    try:
        async with EngineClient(agent.engine.url, timeout_s=120) as client:
            for cycle in range(args.cycles):
                calls = [
                    asyncio.create_task(client.generate([1, 2, 3, cycle, i], long))
                    for i in range(args.inflight)
                ]
                await _in_flight(agent.engine, args.inflight)
                result = await agent.switch_role(TRAINING)
                to_training.append(result.duration_s)
                handed_back += result.requests_handed_back
                for outcome in await asyncio.gather(*calls, return_exceptions=True):
                    if isinstance(outcome, BaseException) and not isinstance(outcome, EngineError):
                        raise outcome
                trainer = agent.training.trainer
                assert isinstance(trainer, TorchTrainer) and trainer.version is not None
                step = trainer.version
                steps = synthetic_microsteps(
                    trainer.model,
                    batch_id=f"b{step}",
                    step=step,
                    num_groups=2,
                    group_size=2,
                    token_budget=512,
                    seed=cycle,
                )
                queue = WorkQueue(redis, Keys(run_id), f"microsteps:b{step}")
                for s in steps:
                    await queue.put(f"b{step}:{s.index}", encode_microstep(s))
                await queue.close()
                await agent.join_batch(f"b{step}", step, True)
                result = await agent.switch_role(ROLLOUT, weight_version=step + 1)
                assert result.weight_version == step + 1
                to_rollout.append(result.duration_s)
    finally:
        await agent.stop()
        await bus.close()
        await redis.aclose()
    return {
        "rollout_to_training_s_p50": round(statistics.median(to_training), 4),
        "training_to_rollout_s_p50": round(statistics.median(to_rollout), 4),
        "rollout_to_training_s_max": round(max(to_training), 4),
        "training_to_rollout_s_max": round(max(to_rollout), 4),
        "requests_handed_back": handed_back,
        "cycles": args.cycles,
        "inflight_per_switch": args.inflight,
        "release_weights": args.release_weights,
        "backend": args.backend,
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench switch", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="HF model directory (default: the embedded default's warm start)",
    )
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument(
        "--inflight", type=int, default=8, help="generations running at each switch to training"
    )
    parser.add_argument("--release-weights", action="store_true", help="also release the engine's weights")
    parser.add_argument(
        "--backend",
        choices=["embedded", "sglang"],
        default="embedded",
        help="the cell's rollout engine (sglang: a real server, app/demo/sglang.yaml's CPU settings)",
    )
    args = parser.parse_args(argv)

    async def body(root: Path) -> dict[str, Any]:
        nats, redis = start_nats(root / "nats"), start_redis(root / "redis", appendonly=False)
        try:
            return await _run(args, root, nats.url, redis.url)
        finally:
            nats.stop()
            redis.stop()

    run_bench("switch", body)
