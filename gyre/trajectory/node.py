"""Nodes of a trajectory tree and the metadata of one recorded model call.

A node is one message-level segment of an execution's context:
- `ROOT`: the system turn with the tool definitions; children of the tree's virtual root are keyed
  by the root key (profile-cleaned system prompt + tools), so a sub-agent gets its own subtree;
- `MESSAGE`: a message supplied by the harness (user turn, tool results, injected system text),
  encoded with the chat template;
- `OUTPUT`: an engine output — generation prompt (supplied) + the exact sampled ids + closing ids
  (supplied) — with the behaviour log-prob of every sampled id and the call's metadata.

Memory is proportional to unique content: token ids are int32 arrays, the provenance mask a bool
array (absent when nothing was sampled), log-probs float32 for sampled ids only, and — with routing
replay — the MoE experts of each token (int16, `gyre.trajectory.routing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from gyre.trajectory.messages import ToolUseBlock
from gyre.trajectory.profiles import AgentKind, LeafClass, RequestKind

EMPTY_IDS: npt.NDArray[np.int32] = np.zeros(0, dtype=np.int32)
EMPTY_LOGPROBS: npt.NDArray[np.float32] = np.zeros(0, dtype=np.float32)


class NodeKind(IntEnum):
    ROOT = 1
    MESSAGE = 2
    OUTPUT = 3


@dataclass(slots=True)
class CallMeta:
    """Metadata of one recorded model call (stored on its output node)."""

    request_id: str = ""
    policy_version: int = -1
    """Policy version of the weights that sampled the output."""
    engine_id: str = ""
    started_at_s: float = 0.0
    """Unix time the proxy received the request."""
    first_token_s: float = 0.0
    """Seconds from receipt to the first output token."""
    finished_at_s: float = 0.0
    """Unix time the output was complete."""


@dataclass(slots=True, eq=False)
class Node:
    node_id: int
    """Unique in the tree, assigned in commit order (a parent's id is smaller than its children's)."""
    parent: Node | None
    """None for a ROOT node (its parent is the tree's virtual root)."""
    kind: NodeKind
    role: str
    digest: bytes
    """Key under the parent: the message digest, or the root key for a ROOT node."""
    path_digest: bytes
    """Digest of the root-to-node path (seeds tool-call ids of outputs that extend this node)."""
    token_ids: npt.NDArray[np.int32]
    sampled: npt.NDArray[np.bool_] | None = None
    """Provenance: True where the engine sampled the token; None = all supplied."""
    logprobs: npt.NDArray[np.float32] = field(default_factory=lambda: EMPTY_LOGPROBS)
    """Behaviour log-probs of the sampled tokens, in order (len == num_sampled)."""
    routed_experts: npt.NDArray[np.int16] | None = None
    """MoE experts the engine chose per token, [num_tokens, L·k] (-1: not known); None when not
    recorded (`gyre.trajectory.routing`)."""
    agent_kind: AgentKind = AgentKind.MAIN
    request_kind: RequestKind = RequestKind.TASK
    meta: CallMeta | None = None
    tool_calls: tuple[ToolUseBlock, ...] = ()
    """Tool calls of an output, as emitted (the restoration source)."""
    aliases: list[bytes] = field(default_factory=list)
    """Further digests the parent maps to this node (echoed forms of the same message)."""
    depth: int = 0
    num_sampled: int = 0
    children: dict[bytes, Node] = field(default_factory=dict)
    """Digest (or alias) → child."""
    child_nodes: list[Node] = field(default_factory=list)

    @property
    def parent_id(self) -> int:
        return self.parent.node_id if self.parent is not None else 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_leaf(self) -> bool:
        return self.kind is NodeKind.OUTPUT and not self.child_nodes

    @property
    def leaf_class(self) -> LeafClass:
        return LeafClass.of(self.agent_kind, self.request_kind)

    def path(self) -> list[Node]:
        """Nodes from the ROOT node down to this one."""
        nodes: list[Node] = []
        node: Node | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes

    def attach(self, child: Node) -> None:
        self.children[child.digest] = child
        self.child_nodes.append(child)
        for alias in child.aliases:
            self.children.setdefault(alias, child)
