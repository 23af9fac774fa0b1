"""Tree rows (`materialize(..., row_layout="tree")`) over generated branching executions
(compaction, sub-agents, retries): for every admitted path, the tree row holds exactly the path
row's tokens, positions, targets, behaviour log-probs and versions, and under the tree mask each of
those tokens attends exactly the tokens before it on that path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.trajectory import admit, materialize
from gyre.trajectory.row import TrajectoryRow

from .harness_sim import run_script

ACTIONS = st.lists(
    st.sampled_from(
        ["step", "step", "retry", "retry", "compact", "sub", "sub", "sub_compact", "sub_end", "parallel"]
    ),
    min_size=1,
    max_size=24,
)


def _path_index(tree_row: TrajectoryRow, path_row: TrajectoryRow) -> np.ndarray:
    """Token indices of the tree row whose tokens are those of `path_row` (one leaf's chain)."""
    if tree_row.tree is None:
        return np.arange(tree_row.num_tokens)
    found = []
    for chain in tree_row.tree.chains():
        index = np.concatenate([chain.context, np.arange(chain.start, chain.end)])
        if np.array_equal(tree_row.token_ids[index], path_row.token_ids):
            found.append(index)
    assert len(found) == 1, "each admitted path is exactly one root-to-leaf path of its tree row"
    return found[0]


def check_tree_rows(path_rows: list[TrajectoryRow], tree_rows: list[TrajectoryRow], roots: list[int]) -> None:
    """`roots[j]`: the root node of path row j (from admission)."""
    order = list(dict.fromkeys(roots))
    assert len(tree_rows) == len(order), "one tree row per root with admitted paths"
    claimed = [np.zeros(r.num_tokens, np.int64) for r in tree_rows]
    for path, root in zip(path_rows, roots, strict=True):
        k = order.index(root)
        row = tree_rows[k]
        index = _path_index(row, path)
        n = len(index)
        layout = row.layout
        assert np.array_equal(row.token_ids[index], path.token_ids)
        assert np.array_equal(layout.position_ids()[index], np.arange(n))
        assert np.array_equal(row.policy_versions[index], path.policy_versions)
        mask = layout.mask()
        assert np.array_equal(mask[np.ix_(index, index)], np.tril(np.ones((n, n), np.bool_)))
        assert np.array_equal(mask[index].sum(axis=1), np.arange(1, n + 1)), "a token sees off its path"
        assert np.array_equal(layout.predecessors()[index[1:]], index[:-1])
        targets = index[path.target_mask]
        assert row.target_mask[targets].all()
        assert np.array_equal(row.behaviour_logprobs[targets], path.behaviour_logprobs[path.target_mask])
        claimed[k][targets] += 1
    for row, count, root in zip(tree_rows, claimed, order, strict=True):
        assert np.array_equal(count, row.target_mask.astype(np.int64)), "every target once, no other"
        assert row.num_trajectories == roots.count(root)
        assert row.num_targets == sum(
            p.num_targets for p, r in zip(path_rows, roots, strict=True) if r == root
        )
        assert row.num_tokens <= sum(p.num_tokens for p, r in zip(path_rows, roots, strict=True) if r == root)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    actions=ACTIONS,
    admit_seed=st.integers(0, 1000),
    j_max=st.one_of(st.none(), st.integers(1, 8)),
)
def test_tree_rows_reproduce_every_admitted_path(
    seed: int, actions: list[str], admit_seed: int, j_max: int | None
) -> None:
    tree = run_script(seed, actions).tree
    admitted = admit(tree, j_max=j_max, seed=admit_seed)
    path_rows = materialize(tree, admitted, "paths")
    tree_rows = materialize(tree, admitted, "tree")
    check_tree_rows(path_rows, tree_rows, [a.path_ids[0] for a in admitted])
    assert [r.trajectory_index for r in tree_rows] == sorted(r.trajectory_index for r in tree_rows)


def test_a_branching_execution_shares_its_prefixes_once() -> None:
    actions = [
        "step",
        "step",
        "retry",
        "step",
        "sub",
        "sub",
        "retry",
        "compact",
        "step",
        "retry",
        "sub_compact",
        "sub",
    ]
    tree = run_script(11, actions).tree
    admitted = admit(tree, j_max=None, seed=0)
    path_rows = materialize(tree, admitted, "paths")
    tree_rows = materialize(tree, admitted, "tree")
    check_tree_rows(path_rows, tree_rows, [a.path_ids[0] for a in admitted])
    assert len(tree_rows) == 2, "the sub-agent's own root is its own row"
    assert all(r.tree is not None for r in tree_rows)
    assert sum(r.num_tokens for r in tree_rows) < 0.8 * sum(r.num_tokens for r in path_rows)
    # each node once: the tree rows hold exactly the tokens of the union of the admitted paths
    union = {i for a in admitted for i in a.path_ids}
    assert sum(r.num_tokens for r in tree_rows) == sum(tree.nodes[i].num_tokens for i in union)


def test_unknown_row_layout_is_refused() -> None:
    tree = run_script(1, ["step"]).tree
    with pytest.raises(ValueError, match="row_layout must be one of paths, tree"):
        materialize(tree, admit(tree), "flat")  # type: ignore[arg-type]
