"""Counts that describe a trajectory tree: shared (stored once) versus expanded (every path alone).

`unique_*` count what the tree stores; `expanded_*` count what materializing every root-to-leaf
path independently would hold. Their gap is the redundancy the tree avoids (the paper's
Appendix C: 1,347 unique message nodes against 1,716 node occurrences over 10 paths).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gyre.trajectory.node import NodeKind
from gyre.trajectory.profiles import LEAF_PRIORITY
from gyre.trajectory.tree import TrajectoryTree


@dataclass(slots=True)
class TreeStats:
    num_nodes: int
    num_message_nodes: int
    """Nodes below the roots (messages and outputs)."""
    roots_by_agent: dict[str, int]
    leaves_by_class: dict[str, int]
    unique_tokens: int
    sampled_tokens: int
    expanded_tokens: int
    expanded_message_nodes: int
    """Message/output node occurrences summed over all root-to-leaf paths."""
    max_depth: int
    path_message_nodes: list[int] = field(default_factory=list)
    """Message/output nodes on each leaf's path, in leaf order."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.num_nodes,
            "message_nodes": self.num_message_nodes,
            "roots": self.roots_by_agent,
            "leaves": self.leaves_by_class,
            "unique_tokens": self.unique_tokens,
            "sampled_tokens": self.sampled_tokens,
            "expanded_tokens": self.expanded_tokens,
            "expanded_message_nodes": self.expanded_message_nodes,
            "max_depth": self.max_depth,
        }


def tree_stats(tree: TrajectoryTree) -> TreeStats:
    path_tokens: dict[int, int] = {}
    nodes = tree.ordered_nodes()
    for n in nodes:
        path_tokens[n.node_id] = n.num_tokens + (path_tokens[n.parent.node_id] if n.parent is not None else 0)
    leaves = [n for n in nodes if n.is_leaf]
    roots = Counter(str(n.agent_kind) for n in nodes if n.kind is NodeKind.ROOT)
    classes = Counter(str(leaf.leaf_class) for leaf in leaves)
    path_nodes = [leaf.depth for leaf in leaves]
    return TreeStats(
        num_nodes=len(nodes),
        num_message_nodes=sum(1 for n in nodes if n.kind is not NodeKind.ROOT),
        roots_by_agent={"main": roots.get("main", 0), "sub": roots.get("sub", 0)},
        leaves_by_class={str(c): classes.get(str(c), 0) for c in LEAF_PRIORITY},
        unique_tokens=sum(n.num_tokens for n in nodes),
        sampled_tokens=sum(n.num_sampled for n in nodes),
        expanded_tokens=sum(path_tokens[leaf.node_id] for leaf in leaves),
        expanded_message_nodes=sum(path_nodes),
        max_depth=max((n.depth for n in nodes), default=0),
        path_message_nodes=path_nodes,
    )
