"""Routing replay (R3) through the trainer: executions recorded with an engine whose routers differ from
the trainer's (router noise), admitted, materialized as path rows and as tree rows, packed and sent
through the micro-step codec. With `routing_replay` the torch trainer routes every token as the
engine did (no flips; without replay some tokens flip), and tree rows give the gradient of path rows
(float64, to rounding); the gradient differs from the one without replay."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

from gyre.config.training import TrainerSection
from gyre.model.causal_lm import CausalLM, SparseMoeBlock
from gyre.model.routing import ExpertRouting
from gyre.model.weights import load_model
from gyre.rl.codec import decode_microstep, encode_microstep
from gyre.rl.loss import ObjectiveParams
from gyre.rl.microstep import MicroStep
from gyre.rl.packing import pack
from gyre.trainer.backends import TrainerSpec, create_trainer
from gyre.trainer.backends.torch_backend import TorchTrainer
from gyre.trajectory import TrajectoryTree, admit, materialize
from gyre.trajectory.materialize import RowLayout
from tests.support.models import MOE_SMALL, small_dir
from tests.support.models import moe_dir as _moe_dir
from tests.unit.trajectory.harness_sim import run_script

LAYERS, TOP_K = 2, 2
MOE = {**MOE_SMALL, "max_position_embeddings": 4096}
SCRIPTS = [
    ["step", "retry", "sub", "sub", "step", "compact", "step", "retry"],
    ["step", "step", "retry", "sub", "sub_compact", "sub", "step"],
]
ADVANTAGES = [1.0, -0.7]


def moe_dir() -> Path:
    return _moe_dir(4, **MOE)


def trainer(routing_replay: bool) -> TorchTrainer:
    section = TrainerSection(dtype="float64", routing_replay=routing_replay)
    backend = create_trainer("torch", TrainerSpec(section, moe_dir(), ObjectiveParams(), False))
    assert isinstance(backend, TorchTrainer)
    return backend


@functools.cache
def engine() -> CausalLM:
    """The trainer's model with noise on every router: the engine a dtype or a step away."""
    model = load_model(moe_dir(), torch.float64)
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for layer in model.model.layers:
            if isinstance(layer.mlp, SparseMoeBlock):
                w = layer.mlp.gate.weight
                w.add_(torch.randn(w.shape, generator=gen, dtype=w.dtype) * 0.5 * w.abs().mean())
    return model


def route(ids: np.ndarray) -> np.ndarray:
    routing = ExpertRouting()
    with torch.no_grad():
        engine()(
            torch.as_tensor(ids, dtype=torch.int64), torch.arange(len(ids)), [0, len(ids)], routing=routing
        )
    return routing.stacked(LAYERS, TOP_K).reshape(len(ids), -1).numpy()


def behave(tree: TrajectoryTree, model: CausalLM, rng: np.random.Generator) -> None:
    """Behaviour log-probs: the trainer's own under the recorded routing, plus noise (a loss inside the
    clip band, so the gradient is not zero)."""
    with torch.no_grad():
        for leaf in tree.leaves():
            path = leaf.path()
            ids = torch.as_tensor(np.concatenate([n.token_ids for n in path]), dtype=torch.int64)
            rows = np.concatenate(
                [
                    n.routed_experts
                    if n.routed_experts is not None
                    else np.full((n.num_tokens, LAYERS * TOP_K), -1)
                    for n in path
                ]
            )
            replay = ExpertRouting(replay=torch.as_tensor(rows, dtype=torch.int64).view(-1, LAYERS, TOP_K))
            logits = model(ids, torch.arange(len(ids)), [0, len(ids)], routing=replay)
            logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[1:, None]).squeeze(1).numpy()
            start = 0
            for node in path:
                if node.num_sampled:
                    at = start + np.flatnonzero(node.sampled)
                    node.logprobs = (logprobs[at - 1] + rng.normal(0.0, 0.01, len(at))).astype(np.float32)
                start += node.num_tokens


@functools.cache
def trees() -> tuple[TrajectoryTree, ...]:
    model = trainer(True).model
    rng = np.random.default_rng(0)
    out = []
    for k, script in enumerate(SCRIPTS):
        tree = run_script(200 + k, script, route).tree
        behave(tree, model, rng)
        out.append(tree)
    return tuple(out)


def microstep(layout: RowLayout) -> MicroStep:
    rows = [r for k, t in enumerate(trees()) for r in materialize(t, admit(t, j_max=8, seed=k), layout)]
    advantages = {t.execution_id: a for t, a in zip(trees(), ADVANTAGES, strict=True)}
    (step,) = pack(rows, advantages, num_batch_executions=2, token_budget=10**6)
    return decode_microstep(encode_microstep(step))


def gradient(backend: TorchTrainer, step: MicroStep) -> torch.Tensor:
    backend.zero_grads()
    backend.accumulate(step)
    return backend.flat_grads.clone()


def _flips(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.sort(dim=-1).values != b.sort(dim=-1).values).any(dim=-1).sum())


def test_the_trainer_routes_as_the_engine_with_replay_and_flips_without() -> None:
    step = microstep("tree")
    assert step.tree is not None and step.routed_experts is not None
    model = trainer(True).model
    ids, pos = (
        torch.as_tensor(step.input_ids, dtype=torch.int64),
        torch.as_tensor(step.position_ids, dtype=torch.int64),
    )
    recorded = torch.as_tensor(step.routed_experts, dtype=torch.int64).view(-1, LAYERS, TOP_K)
    known = (recorded >= 0).any(dim=-1).any(dim=-1)
    assert known.float().mean() > 0.9
    free, replayed = ExpertRouting(), ExpertRouting(replay=recorded)
    with torch.no_grad():
        model(ids, pos, step.cu_seqlens, step.tree, routing=free)
        model(ids, pos, step.cu_seqlens, step.tree, routing=replayed)
    got_free, got_replayed = free.stacked(LAYERS, TOP_K)[known], replayed.stacked(LAYERS, TOP_K)[known]
    assert _flips(got_free, recorded[known].int()) > 0
    assert _flips(got_replayed, recorded[known].int()) == 0


def test_tree_rows_give_the_path_gradient_with_replay() -> None:
    replaying, plain = trainer(True), trainer(False)
    paths, tree = microstep("paths"), microstep("tree")
    assert tree.tree is not None and tree.num_tokens < paths.num_tokens
    g_paths, g_tree = gradient(replaying, paths), gradient(replaying, tree)
    assert float(g_paths.abs().max()) > 1e-4, "the gradient must not be trivially small"
    assert float((g_tree - g_paths).abs().max()) <= 1e-10
    g_expanded = gradient(replaying, tree.as_path_rows())
    assert float((g_expanded - g_paths).abs().max()) <= 1e-10
    g_free = gradient(plain, tree)
    assert float((g_free - g_tree).abs().max()) > 1e-6, "replay must change the gradient of flipped tokens"


def test_replay_without_recorded_routing_or_on_a_dense_model_is_refused() -> None:
    step = microstep("paths")
    bare = MicroStep(
        **{**{f: getattr(step, f) for f in MicroStep.__dataclass_fields__}, "routed_experts": None}
    )
    with pytest.raises(ValueError, match="carries no routed experts"):
        trainer(True).accumulate(bare)
    dense = TrainerSpec(TrainerSection(routing_replay=True), small_dir(), ObjectiveParams(), False)
    with pytest.raises(ValueError, match="needs an MoE model"):
        create_trainer("torch", dense)
