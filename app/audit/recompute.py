"""What the packer must have made of a trained group, recomputed for the audit from primary data: the
evaluator's rewards, each member's recorded trajectory tree and the run's packer settings.

    advantages = recompute_advantages({"e0": ("valid", 1.0), "e1": ("valid", 0.0)}, normalize_std=False)
    admitted = admit_paths(tree, j_max=5, seed=seed)        # draw order, as the packer drew
    rows = expected_rows(tree, admitted, row_layout="tree")

The audit checks the packer with code of its own, written from the rules of docs/method.md rather than
calling the packer's (`gyre/rl/advantages.py`, `gyre/trajectory/admission.py`, `materialize.py`), so a
defect there shows as a difference instead of being reproduced:

- **advantages**: each resolved member's reward (a placeholder counts 0) minus the group's mean, divided
  by the population std + 1e-6 under `packer.normalize_std`; every advantage 0 when the rewards are all
  equal; an excluded member gets none.
- **admission**: at most J_max draws per execution; each draw takes the highest leaf class of
  main > main_summary > sub_agent > sub_agent_summary with unmasked engine-sampled tokens on a leaf's path,
  picks one of its leaves with probability ∝ those tokens (`random.Random(seed)`, the packer's per-execution
  seed), freezes that path's unmasked sampled tokens as its targets and masks the whole path.
- **rows**: `paths`: one row per admitted path, in draw order; `tree`: one row per root holding the union of
  its admitted paths, nodes depth first with children in commit (id) order. Per token: the id, whether
  the engine sampled it, whether it is a target, its behaviour log-prob and the version that sampled it
  (targets only), and the token whose logits predict it (`predecessors`, row-relative).

The only things taken from the library are the tree itself (its decoded nodes) and the leaf class order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre.trajectory.node import Node
from gyre.trajectory.profiles import LEAF_PRIORITY
from gyre.trajectory.tree import TrajectoryTree

STD_EPS = 1e-6
"""The ε of `(r − mean) / (std + ε)` under `packer.normalize_std` (the packer's)."""


@dataclass(frozen=True, slots=True)
class AdmittedPath:
    """One draw of admission: a leaf's root-to-leaf path and the nodes whose sampled tokens it trains."""

    path: tuple[Node, ...]
    targets: frozenset[int]
    """Node ids on the path that were unmasked and hold sampled tokens when it was drawn."""


@dataclass(frozen=True, slots=True)
class ExpectedRow:
    """One training row as the packer must have written it (arrays of the row's tokens)."""

    token_ids: npt.NDArray[np.int32]
    sampled: npt.NDArray[np.bool_]
    """True where the engine sampled the token (only these may ever be targets)."""
    target_mask: npt.NDArray[np.bool_]
    behaviour_logprobs: npt.NDArray[np.float32]
    """The recorded log-prob at targets, 0.0 elsewhere."""
    versions: npt.NDArray[np.int32]
    """The policy version that sampled each target, -1 elsewhere."""
    predecessors: npt.NDArray[np.int64]
    """The row-relative index of the token whose logits predict each token (-1 at the row's first)."""

    @property
    def num_targets(self) -> int:
        return int(self.target_mask.sum())


def recompute_advantages(
    members: Mapping[str, tuple[str, float]], *, normalize_std: bool
) -> dict[str, float]:
    """Execution → advantage over the resolved members; `members`: execution → (status, reward)."""
    rewards = {eid: r if s == "valid" else 0.0 for eid, (s, r) in members.items() if s != "excluded"}
    if not rewards:
        return {}
    values = list(rewards.values())
    if min(values) == max(values):
        return dict.fromkeys(rewards, 0.0)
    mean = math.fsum(values) / len(values)
    if not normalize_std:
        return {eid: r - mean for eid, r in rewards.items()}
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in values) / len(values))
    return {eid: (r - mean) / (std + STD_EPS) for eid, r in rewards.items()}


def admit_paths(tree: TrajectoryTree, *, j_max: int, seed: int) -> list[AdmittedPath]:
    """The paths admission draws from `tree`, in draw order (see the module docstring)."""
    rng = random.Random(seed)
    nodes = [tree.nodes[i] for i in sorted(tree.nodes)]
    leaves = [n for n in nodes if n.is_leaf]
    masked: set[int] = set()
    drawn: list[AdmittedPath] = []
    while len(drawn) < j_max:
        free: dict[int, int] = {}  # unmasked sampled tokens from the root down to each node
        for n in nodes:  # a parent's id is smaller than its children's
            above = free[n.parent.node_id] if n.parent is not None else 0
            free[n.node_id] = above + (0 if n.node_id in masked else n.num_sampled)
        leaf = _draw(leaves, free, rng)
        if leaf is None:
            break
        path = tuple(leaf.path())
        targets = frozenset(n.node_id for n in path if n.num_sampled and n.node_id not in masked)
        drawn.append(AdmittedPath(path, targets))
        masked.update(n.node_id for n in path)
    return drawn


def _draw(leaves: Sequence[Node], free: Mapping[int, int], rng: random.Random) -> Node | None:
    for leaf_class in LEAF_PRIORITY:
        weighted = [(leaf, free[leaf.node_id]) for leaf in leaves if leaf.leaf_class is leaf_class]
        total = sum(w for _, w in weighted)
        if total == 0:
            continue
        point = rng.random() * total
        for leaf, weight in weighted:
            if point < weight:
                return leaf
            point -= weight
        return [leaf for leaf, w in weighted if w > 0][-1]  # rounding left the point past the end
    return None


def expected_rows(
    tree: TrajectoryTree, admitted: Sequence[AdmittedPath], *, row_layout: str
) -> list[ExpectedRow]:
    """The rows of the admitted paths in the run's `packer.row_layout` (`paths` or `tree`)."""
    if row_layout == "paths":
        groups = [[a] for a in admitted]
    elif row_layout == "tree":
        by_root: dict[int, list[AdmittedPath]] = {}
        for a in admitted:
            by_root.setdefault(a.path[0].node_id, []).append(a)
        groups = list(by_root.values())
    else:
        raise ValueError(f"packer.row_layout {row_layout!r} is neither paths nor tree")
    return [_row(tree, group) for group in groups]


def _row(tree: TrajectoryTree, group: list[AdmittedPath]) -> ExpectedRow:
    members = {n.node_id for a in group for n in a.path}
    targets = frozenset().union(*(a.targets for a in group))
    order: list[Node] = []
    stack = [group[0].path[0]]
    while stack:  # depth first, children in id order
        node = stack.pop()
        order.append(node)
        stack.extend(sorted((c for c in node.child_nodes if c.node_id in members), key=lambda c: -c.node_id))
    total = sum(n.num_tokens for n in order)
    token_ids = np.zeros(total, np.int32)
    sampled = np.zeros(total, np.bool_)
    target_mask = np.zeros(total, np.bool_)
    logprobs = np.zeros(total, np.float32)
    versions = np.full(total, -1, np.int32)
    predecessors = np.arange(-1, total - 1, dtype=np.int64)
    last: dict[int, int] = {}  # node id → the row index of its path's last token so far
    at = 0
    for node in order:
        end = at + node.num_tokens
        above = last[node.parent.node_id] if node.parent is not None and node.parent.node_id in last else -1
        if end > at:
            predecessors[at] = above
        token_ids[at:end] = node.token_ids
        if node.sampled is not None:
            sampled[at:end] = node.sampled
            if node.node_id in targets:
                where = at + np.flatnonzero(node.sampled)
                target_mask[where] = True
                logprobs[where] = node.logprobs
                versions[where] = node.meta.policy_version if node.meta is not None else -1
        last[node.node_id] = end - 1 if end > at else above
        at = end
    return ExpectedRow(token_ids, sampled, target_mask, logprobs, versions, predecessors)
