"""MoE routing in the trajectory tree (routing replay): commits spread each call's engine routing over
its path, a shared prefix holds its rows once and later calls fill only rows not known yet; nodes,
path rows, tree rows and micro-steps carry the same rows per token, through the node and micro-step
codecs."""

from __future__ import annotations

import numpy as np
import pytest

from gyre.rl.codec import decode_microstep, encode_microstep
from gyre.rl.packing import pack
from gyre.trajectory import admit, materialize
from gyre.trajectory.codec import decode_node, encode_node
from gyre.trajectory.routing import known_rows, spread_routing

from .harness_sim import run_script
from .test_tree_rows import _path_index

SCRIPT = ["step", "retry", "sub", "sub", "step", "compact", "step", "sub", "retry", "sub_compact", "step"]
WIDTH = 6  # 3 layers x 2 experts


def route(ids: np.ndarray, base: int = 0) -> np.ndarray:
    """A deterministic routing of a causal model: row j depends on the tokens up to j only."""
    prefix = np.cumsum(ids.astype(np.int64) * 31 + 7)
    return ((prefix[:, None] + np.arange(WIDTH)[None, :] * 5 + base) % 8).astype(np.int32)


def test_each_path_holds_the_engines_routing_once_per_node() -> None:
    sim = run_script(3, SCRIPT, route)
    tree = sim.tree
    leaves = list(tree.leaves())
    assert len(leaves) >= 4
    for leaf in leaves:
        path = leaf.path()
        tokens = np.concatenate([n.token_ids for n in path])
        rows = np.concatenate(
            [
                n.routed_experts if n.routed_experts is not None else np.full((n.num_tokens, WIDTH), -1)
                for n in path
            ]
        )
        known = known_rows(rows)
        assert np.array_equal(rows[known], route(tokens)[known])
        # every token is known except the leaf's last sampled token and closing ids (no call forwarded them)
        assert leaf.sampled is not None
        last_sampled = sum(n.num_tokens for n in path[:-1]) + int(np.flatnonzero(leaf.sampled)[-1])
        assert known[:last_sampled].all() and not known[last_sampled:].any()


def test_a_later_call_fills_rows_and_keeps_known_ones() -> None:
    sim = run_script(4, ["step", "step"], route)
    first_leaf = sim.tree.nodes[sim.commits[0].node_id]
    assert first_leaf.routed_experts is not None and known_rows(first_leaf.routed_experts).all()
    before = {n.node_id: n.routed_experts.copy() for n in first_leaf.path() if n.routed_experts is not None}
    changed = spread_routing(
        first_leaf.path(), route(np.concatenate([n.token_ids for n in first_leaf.path()]), 1)
    )
    assert changed == []  # every row is known: a different routing does not overwrite it
    for node in first_leaf.path():
        assert np.array_equal(node.routed_experts, before[node.node_id])
    with pytest.raises(ValueError, match="cover"):
        spread_routing(first_leaf.path(), np.zeros((10**5, WIDTH), np.int32))


@pytest.mark.parametrize("base", [0, 300])
def test_the_node_codec_round_trips_routing_in_one_or_two_bytes(base: int) -> None:
    sim = run_script(5, SCRIPT, lambda ids: route(ids) + base)
    sizes = []
    for node in sim.tree.nodes.values():
        blob = encode_node(node)
        back, _ = decode_node(blob)
        if node.routed_experts is None:
            assert back.routed_experts is None
        else:
            assert back.routed_experts is not None and np.array_equal(
                back.routed_experts, node.routed_experts
            )
            sizes.append(len(blob) / node.num_tokens)
    assert sizes


def test_path_rows_tree_rows_and_microsteps_carry_the_same_rows_per_token() -> None:
    sim = run_script(6, SCRIPT, route)
    tree = sim.tree
    admitted = admit(tree, j_max=8, seed=0)
    paths, trees = materialize(tree, admitted, "paths"), materialize(tree, admitted, "tree")
    assert any(r.tree is not None for r in trees)
    roots = [a.path_ids[0] for a in admitted]
    order = list(dict.fromkeys(roots))
    for path, root in zip(paths, roots, strict=True):
        row = trees[order.index(root)]
        assert path.routed_experts is not None and row.routed_experts is not None
        assert np.array_equal(row.routed_experts[_path_index(row, path)], path.routed_experts)
    advantages = {tree.execution_id: 1.0}
    (tree_step,) = pack(trees, advantages, num_batch_executions=1, token_budget=10**6)
    (path_step,) = pack(paths, advantages, num_batch_executions=1, token_budget=10**6)
    for step in (tree_step, path_step):
        back = decode_microstep(encode_microstep(step))
        assert back.routed_experts is not None and np.array_equal(back.routed_experts, step.routed_experts)
    expanded = tree_step.as_path_rows()
    for step in (expanded, path_step):  # each path's rows: the engine's routing of its own tokens
        assert step.routed_experts is not None
        for a, b in zip(step.cu_seqlens[:-1], step.cu_seqlens[1:], strict=True):
            rows = step.routed_experts[a:b]
            known = known_rows(rows)
            assert known[: b - a - 3].all()
            assert np.array_equal(rows[known], route(step.input_ids[a:b])[known])
    assert tree_step.routed_experts is not None and len(tree_step.routed_experts) < len(
        path_step.routed_experts
    )
