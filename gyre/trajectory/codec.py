"""Node codec: compact bytes for one tree node (`gyre.v1.TreeNode`), for trees kept in Redis.

The proxy writes `encode_node(n)` for every node a commit returns (`CommitResult.new_nodes` and
`.changed_nodes`) under the node's id, and rebuilds a tree after a restart with
`TrajectoryTree.from_nodes(execution_id, template, profile, blobs)`. Token ids are the array's own
bytes, 2 per id when the node's ids fit (every vocabulary under 65,536 ids), else 4; log-probs float32
bytes; provenance a list of sampled spans; recorded MoE routing one byte per expert id when every id
fits (255 marks a row not known), else int16. Nodes written before (ids and log-probs as repeated
fields) decode as they did.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import numpy.typing as npt

from gyre.trajectory.messages import ToolUseBlock, canonical_json
from gyre.trajectory.node import EMPTY_LOGPROBS, CallMeta, Node, NodeKind
from gyre.trajectory.profiles import AgentKind, RequestKind
from gyre.trajectory.routing import ROUTING_DTYPE
from gyre.v1 import trajectory_pb2 as pb

_AGENT = {AgentKind.MAIN: pb.TREE_AGENT_KIND_MAIN, AgentKind.SUB: pb.TREE_AGENT_KIND_SUB}
_AGENT_BACK = {v: k for k, v in _AGENT.items()}
_REQUEST = {
    RequestKind.TASK: pb.TREE_REQUEST_KIND_TASK,
    RequestKind.SUMMARY: pb.TREE_REQUEST_KIND_SUMMARY,
    RequestKind.SIDE: pb.TREE_REQUEST_KIND_SIDE,
}
_REQUEST_BACK = {v: k for k, v in _REQUEST.items()}
_WIDTHS: dict[int, np.dtype[Any]] = {2: np.dtype("<u2"), 4: np.dtype("<i4")}
"""Bytes per token id → the little-endian dtype they are stored as."""


def encode_node(node: Node) -> bytes:
    """Serialize one node (its parent by id; children are implied by their parents)."""
    ids = node.token_ids
    width = 2 if len(ids) == 0 or (int(ids.min()) >= 0 and int(ids.max()) < 1 << 16) else 4
    msg = pb.TreeNode(
        node_id=node.node_id,
        parent_id=node.parent_id,
        kind=int(node.kind),  # type: ignore[arg-type]
        role=node.role,
        digest=node.digest,
        aliases=node.aliases,
        token_id_width=width,
        token_ids_le=ids.astype(_WIDTHS[width]).tobytes(),
        sampled_spans=_spans(node),
        logprobs_le=node.logprobs.astype("<f4").tobytes(),
        agent_kind=_AGENT[node.agent_kind],
        request_kind=_REQUEST[node.request_kind],
    )
    if node.routed_experts is not None:
        routing = node.routed_experts
        narrow = routing.size == 0 or int(routing.max()) < 255
        msg.routed_experts_width = routing.shape[1]
        msg.routed_experts_id_bytes = 1 if narrow else 2
        msg.routed_experts_le = (
            np.where(routing < 0, 255, routing).astype("<u1") if narrow else routing.astype("<i2")
        ).tobytes()
    for call in node.tool_calls:
        msg.tool_calls.add(
            id=call.id,
            name=call.name,
            raw=call.raw or "",
            has_raw=call.raw is not None,
            arguments_json=canonical_json(call.input),
        )
    if node.meta is not None:
        m = node.meta
        msg.call.CopyFrom(
            pb.CallRecord(
                request_id=m.request_id,
                policy_version=m.policy_version,
                engine_id=m.engine_id,
                started_at_s=m.started_at_s,
                first_token_s=m.first_token_s,
                finished_at_s=m.finished_at_s,
            )
        )
    return msg.SerializeToString()


def decode_node(data: bytes) -> tuple[Node, int]:
    """A node without links (parent None, path digest unset) and its parent's id."""
    msg = pb.TreeNode.FromString(data)
    if msg.kind not in (1, 2, 3):
        raise ValueError(f"tree node {msg.node_id} has no kind")
    if msg.token_id_width:
        if msg.token_id_width not in _WIDTHS or len(msg.token_ids_le) % msg.token_id_width:
            raise ValueError(
                f"tree node {msg.node_id}: {len(msg.token_ids_le)} bytes of token ids of width "
                f"{msg.token_id_width}"
            )
        tokens = np.frombuffer(msg.token_ids_le, dtype=_WIDTHS[msg.token_id_width]).astype(np.int32)
    else:
        tokens = np.asarray(msg.token_ids, dtype=np.int32)
    sampled = None
    if msg.sampled_spans:
        sampled = np.zeros(len(tokens), dtype=np.bool_)
        spans = list(msg.sampled_spans)
        for start, end in zip(spans[::2], spans[1::2], strict=True):
            sampled[start:end] = True
    if len(msg.logprobs_le) % 4:
        raise ValueError(f"tree node {msg.node_id}: {len(msg.logprobs_le)} bytes of float32 log-probs")
    if msg.logprobs_le:
        logprobs = np.frombuffer(msg.logprobs_le, dtype="<f4").astype(np.float32)
    elif len(msg.logprobs):
        logprobs = np.asarray(msg.logprobs, dtype=np.float32)
    else:
        logprobs = EMPTY_LOGPROBS
    num_sampled = int(sampled.sum()) if sampled is not None else 0
    if len(logprobs) != num_sampled:
        raise ValueError(
            f"tree node {msg.node_id}: {len(logprobs)} log-probs for {num_sampled} sampled tokens"
        )
    node = Node(
        node_id=msg.node_id,
        parent=None,
        kind=NodeKind(msg.kind),
        role=msg.role,
        digest=msg.digest,
        path_digest=b"",
        token_ids=tokens,
        sampled=sampled,
        logprobs=logprobs,
        agent_kind=_AGENT_BACK.get(msg.agent_kind, AgentKind.MAIN),
        request_kind=_REQUEST_BACK.get(msg.request_kind, RequestKind.TASK),
        tool_calls=tuple(
            ToolUseBlock(c.id, c.name, json.loads(c.arguments_json or "{}"), c.raw if c.has_raw else None)
            for c in msg.tool_calls
        ),
        aliases=list(msg.aliases),
        num_sampled=num_sampled,
        routed_experts=_routing(msg, len(tokens)),
    )
    if msg.HasField("call"):
        c = msg.call
        node.meta = CallMeta(
            c.request_id, c.policy_version, c.engine_id, c.started_at_s, c.first_token_s, c.finished_at_s
        )
    return node, msg.parent_id


def _routing(msg: pb.TreeNode, num_tokens: int) -> npt.NDArray[np.int16] | None:
    width, size = msg.routed_experts_width, msg.routed_experts_id_bytes
    if not width:
        return None
    if size not in (1, 2) or len(msg.routed_experts_le) != num_tokens * width * size:
        raise ValueError(
            f"tree node {msg.node_id}: {len(msg.routed_experts_le)} bytes of routing for {num_tokens} tokens "
            f"of width {width} at {size} bytes per id"
        )
    if size == 1:
        raw = np.frombuffer(msg.routed_experts_le, dtype="<u1").astype(ROUTING_DTYPE)
        raw[raw == 255] = -1
    else:
        raw = np.frombuffer(msg.routed_experts_le, dtype="<i2").astype(ROUTING_DTYPE)
    return raw.reshape(num_tokens, width)


def _spans(node: Node) -> list[int]:
    if node.sampled is None or not node.sampled.any():
        return []
    padded = np.concatenate([[False], node.sampled, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [int(e) for e in edges]
