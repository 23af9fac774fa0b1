"""Materialization: admitted trajectories → the `TrajectoryRow`s the packer trains on.

Two layouts (`packer.row_layout`):

- `paths`: one row per admitted trajectory with the token ids of its whole root-to-leaf path, so a
  prefix shared by k admitted trajectories is in k rows;
- `tree`: one row per root of the execution's tree (the main agent, each sub-agent with its own
  system prompt) holding the union of the admitted paths under it, each node once, in tree order,
  with a `TreeLayout` that gives every token the position and the ancestors it has in its own path.
  A root with a single admitted path gives a plain path row. A sub-agent's root is its own row, not
  a second subtree of the main row: nothing is shared across roots, and attention costs grow with
  the square of a row's length, so separate rows are cheaper and a single path needs no tree at all.

Either way a row carries the target mask (sampled tokens of its trajectories' frozen target nodes,
and nothing else), the behaviour log-probs aligned to the targets and the policy version of every
sampled token, and — when the tree recorded MoE routing — each token's experts (`routed_experts`,
once per node, so a tree row carries a shared prefix's routing once). Targets are disjoint across trajectories, so a tree row holds exactly the targets of
its path rows, each once. Only this step copies tokens; until then a trajectory is a list of node ids
on the shared tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from gyre.model.tree_layout import TreeLayout
from gyre.trajectory.admission import AdmittedTrajectory
from gyre.trajectory.node import Node
from gyre.trajectory.routing import ROUTING_DTYPE
from gyre.trajectory.row import TrajectoryRow
from gyre.trajectory.tree import TrajectoryTree

RowLayout = Literal["paths", "tree"]
ROW_LAYOUTS: tuple[RowLayout, ...] = ("paths", "tree")


def materialize(
    tree: TrajectoryTree, admitted: Sequence[AdmittedTrajectory], row_layout: RowLayout = "paths"
) -> list[TrajectoryRow]:
    """Rows of the admitted trajectories, ordered by (first) draw index."""
    if row_layout == "paths":
        return [_row(tree, [tree.nodes[i] for i in a.path_ids], [a]) for a in admitted]
    if row_layout == "tree":
        by_root: dict[int, list[AdmittedTrajectory]] = {}
        for a in admitted:
            by_root.setdefault(a.path_ids[0], []).append(a)
        return [_tree_row(tree, group) for group in by_root.values()]
    raise ValueError(f"row_layout must be one of {', '.join(ROW_LAYOUTS)}; got {row_layout!r}")


def _tree_row(tree: TrajectoryTree, group: list[AdmittedTrajectory]) -> TrajectoryRow:
    """The admitted paths of `group` (one root) as one row in tree order."""
    if len(group) == 1:
        return _row(tree, [tree.nodes[i] for i in group[0].path_ids], group)
    members = {i for a in group for i in a.path_ids}
    children: dict[int, list[int]] = {}
    for i in sorted(members):
        parent = tree.nodes[i].parent
        if parent is not None:
            children.setdefault(parent.node_id, []).append(i)
    nodes: list[Node] = []
    lengths: list[int] = []
    parents: list[int] = []
    # Depth first; a node starts a new segment unless it is the only child of the node before it.
    stack: list[tuple[int, int]] = [(group[0].path_ids[0], -1)]  # (node id, parent segment)
    while stack:
        node_id, parent_segment = stack.pop()
        node = tree.nodes[node_id]
        below = children.get(node_id, [])
        if parent_segment == -2:
            lengths[-1] += node.num_tokens
        else:
            lengths.append(node.num_tokens)
            parents.append(parent_segment)
        nodes.append(node)
        segment = len(lengths) - 1
        if len(below) == 1:
            stack.append((below[0], -2))  # -2: continue the current segment
        else:
            stack.extend((c, segment) for c in reversed(below))
    return _row(tree, nodes, group, TreeLayout.single_row(lengths, parents))


def _row(
    tree: TrajectoryTree, nodes: list[Node], group: list[AdmittedTrajectory], layout: TreeLayout | None = None
) -> TrajectoryRow:
    targets = frozenset().union(*(a.target_node_ids for a in group))
    total = sum(n.num_tokens for n in nodes)
    token_ids = np.empty(total, dtype=np.int32)
    target_mask = np.zeros(total, dtype=np.bool_)
    logprobs = np.zeros(total, dtype=np.float32)
    versions = np.full(total, -1, dtype=np.int32)
    width = next((n.routed_experts.shape[1] for n in nodes if n.routed_experts is not None), 0)
    routing = np.full((total, width), -1, dtype=ROUTING_DTYPE) if width else None
    pos = 0
    for node in nodes:
        end = pos + node.num_tokens
        token_ids[pos:end] = node.token_ids
        if routing is not None and node.routed_experts is not None:
            routing[pos:end] = node.routed_experts
        if node.sampled is not None and node.num_sampled:
            positions = pos + np.flatnonzero(node.sampled)
            versions[positions] = node.meta.policy_version if node.meta is not None else -1
            if node.node_id in targets:
                target_mask[positions] = True
                logprobs[positions] = node.logprobs
        pos = end
    assert int(target_mask.sum()) == sum(a.num_targets for a in group), "targets drifted from admission"
    return TrajectoryRow(
        execution_id=tree.execution_id,
        trajectory_index=group[0].index,
        leaf_class=str(group[0].leaf_class),
        token_ids=token_ids,
        target_mask=target_mask,
        behaviour_logprobs=logprobs,
        policy_versions=versions,
        tree=layout,
        routed_experts=routing,
    )
