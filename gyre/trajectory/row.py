"""The training row: admitted trajectories materialized as tokens, the contract between the
trajectory processor (writer) and the RL objective / packer (reader).

A row is either a *path row* (one admitted root-to-leaf path, `tree` None) or a *tree row* (the
union of an execution's admitted paths under one root, each node once, in tree order; `tree` is its
`TreeLayout`, which gives every token's position along its own path and what it attends).

Alignment convention (the usual causal-LM one): `token_ids[t]` is a target when `target_mask[t]`
is true; it is predicted from the logits of the token before it on its path — t - 1 in a path row,
`tree.predecessors()[t]` in a tree row — so a row's first token is never a target.
`behaviour_logprobs[t]` is the log-prob the engine recorded when it sampled `token_ids[t]` (0.0
where the token is not a target).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre.model.tree_layout import TreeLayout


@dataclass(slots=True, frozen=True)
class TrajectoryRow:
    """One admitted root-to-leaf path of an execution's tree, or the tree of several under one root."""

    execution_id: str
    """Execution the trajectory belongs to."""
    trajectory_index: int
    """Draw order within the execution's admission (0 = first admitted); of the first one in a tree row."""
    leaf_class: str
    """`main`, `main_summary`, `sub_agent` or `sub_agent_summary` (of the first trajectory in a tree row)."""
    token_ids: npt.NDArray[np.int32]
    """Token ids of the whole path root to leaf, or of every node of the tree row once, in tree order."""
    target_mask: npt.NDArray[np.bool_]
    """True where the token is one of the row's frozen targets."""
    behaviour_logprobs: npt.NDArray[np.float32]
    """Recorded behaviour log-prob of each target token; 0.0 elsewhere."""
    policy_versions: npt.NDArray[np.int32]
    """Policy version that sampled each token (-1 where the token was supplied, not sampled)."""
    tree: TreeLayout | None = None
    """The segments of a tree row (a layout of one row); None for a path row."""
    routed_experts: npt.NDArray[np.int16] | None = None
    """[n, L·k] MoE experts the engine chose per token (-1: not known); None when no node of the row
    recorded routing (`gyre.trajectory.routing`)."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if not (len(self.target_mask) == len(self.behaviour_logprobs) == len(self.policy_versions) == n):
            raise ValueError("row arrays must all have the length of token_ids")
        if self.routed_experts is not None and (
            self.routed_experts.ndim != 2 or len(self.routed_experts) != n
        ):
            raise ValueError(f"routed_experts must be [{n}, L·k]; got {self.routed_experts.shape}")
        if n and bool(self.target_mask[0]):
            raise ValueError("position 0 cannot be a target (nothing precedes it)")
        if self.tree is not None and (self.tree.num_rows != 1 or self.tree.num_tokens != n):
            raise ValueError(f"a tree row's layout must describe one row of its {n} tokens")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_targets(self) -> int:
        return int(self.target_mask.sum())

    @property
    def num_trajectories(self) -> int:
        """Admitted root-to-leaf paths the row holds (1 for a path row)."""
        return 1 if self.tree is None else int(self.tree.num_leaves()[0])

    @property
    def layout(self) -> TreeLayout:
        """The row's layout; a path row is one segment."""
        return self.tree if self.tree is not None else TreeLayout.path_rows([self.num_tokens])
