"""Materialization: an admitted trajectory → a `TrajectoryRow` the packer trains on.

The row holds the token ids of the whole root-to-leaf path, the target mask (sampled tokens of the
trajectory's frozen target nodes, and nothing else), the behaviour log-probs aligned to the targets
and the policy version of every sampled token. Only this step copies tokens; until then a
trajectory is a list of node ids on the shared tree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gyre.trajectory.admission import AdmittedTrajectory
from gyre.trajectory.row import TrajectoryRow
from gyre.trajectory.tree import TrajectoryTree


def materialize(tree: TrajectoryTree, admitted: Sequence[AdmittedTrajectory]) -> list[TrajectoryRow]:
    """One row per admitted trajectory, in draw order."""
    return [_row(tree, a) for a in admitted]


def _row(tree: TrajectoryTree, admitted: AdmittedTrajectory) -> TrajectoryRow:
    path = [tree.nodes[i] for i in admitted.path_ids]
    total = sum(n.num_tokens for n in path)
    token_ids = np.empty(total, dtype=np.int32)
    target_mask = np.zeros(total, dtype=np.bool_)
    logprobs = np.zeros(total, dtype=np.float32)
    versions = np.full(total, -1, dtype=np.int32)
    pos = 0
    for node in path:
        end = pos + node.num_tokens
        token_ids[pos:end] = node.token_ids
        if node.sampled is not None and node.num_sampled:
            positions = pos + np.flatnonzero(node.sampled)
            versions[positions] = node.meta.policy_version if node.meta is not None else -1
            if node.node_id in admitted.target_node_ids:
                target_mask[positions] = True
                logprobs[positions] = node.logprobs
        pos = end
    assert int(target_mask.sum()) == admitted.num_targets, "targets drifted from the admission count"
    return TrajectoryRow(
        execution_id=tree.execution_id,
        trajectory_index=admitted.index,
        leaf_class=str(admitted.leaf_class),
        token_ids=token_ids,
        target_mask=target_mask,
        behaviour_logprobs=logprobs,
        policy_versions=versions,
    )
