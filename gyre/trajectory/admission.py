"""Admission: at most J_max trajectories per execution, drawn by role priority on the tree.

The rule (docs/design.md "Admission", paper "Trajectory sampling"): repeat until `j_max` trajectories
are admitted or no unmasked trainable token remains — take the highest-priority leaf class
(main > main_summary > sub_agent > sub_agent_summary) that still has unmasked trainable tokens on
some leaf's path; draw one of its leaves with probability proportional to the unmasked trainable
tokens on its root-to-leaf path; freeze that trajectory's targets to exactly those tokens; mask
the whole path. Targets of different trajectories are therefore disjoint, a shared prefix is
trained once, and the reduced counts reweight later draws.

Trainable = engine-sampled; masking is per node (a drawn path masks all its nodes), so the loop
works on per-node counts: one pass over the nodes per draw. Deterministic for a given seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gyre.trajectory.node import Node
from gyre.trajectory.profiles import LEAF_PRIORITY, LeafClass
from gyre.trajectory.tree import TrajectoryTree


@dataclass(frozen=True, slots=True)
class AdmittedTrajectory:
    index: int
    """Draw order within the execution (0 = first)."""
    leaf_id: int
    leaf_class: LeafClass
    path_ids: tuple[int, ...]
    """Node ids root to leaf."""
    target_node_ids: frozenset[int]
    """Nodes whose sampled tokens are this trajectory's targets (unmasked when drawn)."""
    num_targets: int


def admit(tree: TrajectoryTree, j_max: int | None = 5, seed: int = 0) -> list[AdmittedTrajectory]:
    """Admit trajectories of `tree` (`j_max=None`: no cap, until nothing trainable is left)."""
    if j_max is not None and j_max < 1:
        raise ValueError(f"j_max must be at least 1 (or None for no cap); got {j_max}")
    rng = random.Random(seed)
    nodes = tree.ordered_nodes()
    leaves = [n for n in nodes if n.is_leaf]
    masked: set[int] = set()
    admitted: list[AdmittedTrajectory] = []
    while j_max is None or len(admitted) < j_max:
        unmasked = _path_counts(nodes, masked)
        choice = _draw(leaves, unmasked, rng)
        if choice is None:
            break
        path = choice.path()
        targets = frozenset(n.node_id for n in path if n.num_sampled and n.node_id not in masked)
        admitted.append(
            AdmittedTrajectory(
                index=len(admitted),
                leaf_id=choice.node_id,
                leaf_class=choice.leaf_class,
                path_ids=tuple(n.node_id for n in path),
                target_node_ids=targets,
                num_targets=unmasked[choice.node_id],
            )
        )
        masked.update(n.node_id for n in path)
    return admitted


def trainable_node_ids(tree: TrajectoryTree) -> set[int]:
    """Nodes holding engine-sampled tokens."""
    return {n.node_id for n in tree.nodes.values() if n.num_sampled}


def _path_counts(nodes: list[Node], masked: set[int]) -> dict[int, int]:
    """Unmasked trainable tokens on each node's root-to-node path (nodes in id order)."""
    counts: dict[int, int] = {}
    for n in nodes:
        own = 0 if n.node_id in masked else n.num_sampled
        counts[n.node_id] = own + (counts[n.parent.node_id] if n.parent is not None else 0)
    return counts


def _draw(leaves: list[Node], unmasked: dict[int, int], rng: random.Random) -> Node | None:
    for leaf_class in LEAF_PRIORITY:
        candidates = [(leaf, unmasked[leaf.node_id]) for leaf in leaves if leaf.leaf_class is leaf_class]
        total = sum(w for _, w in candidates)
        if total == 0:
            continue
        point = rng.random() * total
        for leaf, weight in candidates:
            if point < weight:
                return leaf
            point -= weight
        return next(leaf for leaf, w in reversed(candidates) if w > 0)
    return None
