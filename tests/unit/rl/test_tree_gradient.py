"""Tree-packed rows give the gradient and the loss of path rows (issue 18's acceptance test).

A group of executions with compaction (main agent and sub-agent), a sub-agent with its own root,
and retries is admitted, materialized both ways (`paths`, `tree`) and packed; one step of the torch
trainer (`TorchTrainer.accumulate` over the micro-steps, through the queue codec, as a cell gets
them) must give the same gradient within 1e-5 in float32, and the same loss. Behaviour log-probs
are the model's own plus noise, shifted per execution so that one execution is clipped and the
others are kept: the gradient is not trivially zero and the clip decision is exercised. With a
model that is float64 throughout (the test-local TinyLM)
the layouts agree to 1e-12, also split over several micro-steps, expanded back to path rows and in
the chunked path.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from gyre.config.training import TrainerSection
from gyre.rl.codec import decode_microstep, encode_microstep
from gyre.rl.loss import ObjectiveParams
from gyre.rl.microstep import MicroStep
from gyre.rl.packing import pack
from gyre.rl.step_loss import train_microstep
from gyre.trainer.backends import TrainerSpec, create_trainer
from gyre.trainer.backends.base import TrainerBackend
from gyre.trajectory import TrajectoryTree, admit, materialize
from gyre.trajectory.materialize import RowLayout
from gyre.trajectory.row import TrajectoryRow
from tests.support.models import byte_dir
from tests.unit.rl.helpers import TinyLM
from tests.unit.trajectory.harness_sim import run_script

MODEL = byte_dir(5, 4096, hidden_size=64, num_attention_heads=4, intermediate_size=128)
VOCAB, MAX_POSITIONS = 264, 4096
SCRIPTS = [
    # main: two retries and a compaction; sub-agent: a retry and a compaction
    [
        "step",
        "retry",
        "sub",
        "sub",
        "step",
        "sub",
        "retry",
        "sub_compact",
        "sub",
        "compact",
        "step",
        "step",
        "sub_end",
    ],
    [
        "step",
        "step",
        "retry",
        "compact",
        "step",
        "sub",
        "retry",
        "sub",
        "sub_compact",
        "sub",
        "step",
        "retry",
    ],
    ["step", "sub", "step", "retry", "sub", "sub_compact", "sub", "compact", "step"],
]
ADVANTAGES = [1.0, 0.8, -0.9]
SHIFTS = [0.0, -0.05, 0.0]
"""Per execution, added to the behaviour log-probs: -0.05 puts s_i above 1.005 (clipped, Â > 0)."""


def make_trainer(dtype: str) -> TrainerBackend:
    return create_trainer("torch", TrainerSpec(TrainerSection(dtype=dtype), MODEL, ObjectiveParams(), False))


def on_policy(tree: TrajectoryTree, model: torch.nn.Module, rng: np.random.Generator, shift: float) -> None:
    """Set every output node's behaviour log-probs to the model's own, plus noise and `shift`."""
    with torch.no_grad():
        for leaf in tree.leaves():  # every output node is on some leaf's path
            path = leaf.path()
            ids = torch.as_tensor(np.concatenate([n.token_ids for n in path]), dtype=torch.int64)
            logits = model(ids, torch.arange(len(ids)), [0, len(ids)]).double()
            logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[1:, None]).squeeze(1).numpy()
            start = 0
            for node in path:
                if node.num_sampled:
                    at = start + np.flatnonzero(node.sampled)
                    node.logprobs = (logprobs[at - 1] + rng.normal(0.0, 0.02, len(at)) + shift).astype(
                        np.float32
                    )
                start += node.num_tokens


@functools.cache
def group() -> tuple[TrajectoryTree, ...]:
    """The executions of the group, with on-policy behaviour log-probs."""
    model = make_trainer("float64").model
    rng = np.random.default_rng(0)
    trees = []
    for k, script in enumerate(SCRIPTS):
        tree = run_script(100 + k, script).tree
        on_policy(tree, model, rng, SHIFTS[k])
        trees.append(tree)
    return tuple(trees)


def rows(layout: RowLayout) -> list[TrajectoryRow]:
    trees = group()
    return [r for k, t in enumerate(trees) for r in materialize(t, admit(t, j_max=8, seed=k), layout)]


def microsteps(layout: RowLayout, token_budget: int = 10**6) -> list[MicroStep]:
    advantages = {t.execution_id: a for t, a in zip(group(), ADVANTAGES, strict=True)}
    return pack(rows(layout), advantages, num_batch_executions=4, token_budget=token_budget)


def test_the_group_has_compaction_a_sub_agent_and_retries_in_tree_rows() -> None:
    tree_rows, path_rows = rows("tree"), rows("paths")
    classes = {r.leaf_class for r in path_rows}
    assert classes == {"main", "main_summary", "sub_agent", "sub_agent_summary"}
    assert sum(r.leaf_class == "main" for r in path_rows) >= 2 * len(SCRIPTS), "retries leave main leaves"
    # main and sub-agent roots are separate rows; the branching ones are tree rows
    assert len(tree_rows) == 2 * len(SCRIPTS)
    assert sum(r.tree is not None for r in tree_rows) >= len(SCRIPTS) + 1
    assert sum(r.num_tokens for r in tree_rows) < 0.7 * sum(r.num_tokens for r in path_rows)
    assert sum(r.num_targets for r in tree_rows) == sum(r.num_targets for r in path_rows)


def accumulate(trainer: TrainerBackend, steps: list[MicroStep]) -> tuple[torch.Tensor, dict[str, float]]:
    trainer.zero_grads()
    metrics = None
    for step in steps:
        result = trainer.accumulate(decode_microstep(encode_microstep(step)))
        metrics = result.metrics if metrics is None else metrics.merge(result.metrics)
    assert metrics is not None
    return trainer.flat_grads.clone(), metrics.summary()


def test_tree_rows_give_the_path_gradient_and_loss_in_float32() -> None:
    trainer = make_trainer("float32")
    (paths,), (tree,) = microsteps("paths"), microsteps("tree")
    assert tree.tree is not None and tree.num_tokens < 0.7 * paths.num_tokens
    g_paths, m_paths = accumulate(trainer, [paths])
    g_tree, m_tree = accumulate(trainer, [tree])
    assert m_paths["num_executions"] == 3 and 0 < m_paths["clip_fraction_executions"] < 1
    assert float(g_paths.abs().max()) > 1e-3, "the gradient must not be trivially small"
    assert float((g_tree - g_paths).abs().max()) <= 1e-5
    assert float((g_tree - g_paths).abs().max() / g_paths.abs().max()) <= 1e-5
    assert m_paths["loss"] != 0.0
    for key, value in m_paths.items():  # the loss value first of all
        assert m_tree[key] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), key


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def gradient(model: torch.nn.Module, steps: list[MicroStep], **kwargs: int) -> tuple[torch.Tensor, int]:
    model.zero_grad(set_to_none=True)
    num_chunks = 0
    for step in steps:
        num_chunks += train_microstep(step, model, **kwargs).num_chunks
    return flat_grad(model), num_chunks


def test_tree_rows_give_the_path_gradient_to_rounding_in_float64_however_packed() -> None:
    model = TinyLM(vocab_size=VOCAB, max_positions=MAX_POSITIONS, dtype=torch.float64, seed=1)
    reference, _ = gradient(model, microsteps("paths"))
    assert float(reference.abs().max()) > 1e-2
    (whole,) = microsteps("tree")
    cases = {
        "one micro-step": ([whole], {}),
        "several micro-steps": (microsteps("tree", token_budget=whole.num_tokens // 2), {}),
        "expanded back to paths": ([whole.as_path_rows()], {}),
        "chunked": ([whole], {"chunk_tokens": 1}),
    }
    for name, (steps, kwargs) in cases.items():
        got, num_chunks = gradient(model, steps, **kwargs)
        assert float((got - reference).abs().max()) <= 1e-12, name
        if name == "chunked":
            assert num_chunks == whole.num_rows > 1
        if name == "several micro-steps":
            assert len(steps) > 1
