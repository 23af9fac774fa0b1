"""Answer a retried call with the output already recorded for it, instead of sampling a second one.

    node = unanswered_output(prepared)          # the recorded output of this exact request, if any
    generation = ReplayedGeneration(node, ...)  # stands in for `Generation`: yields the recorded ids

What a harness sees when the proxy process dies under it: the TCP connection of every call in flight
is reset. A streamed call that had started answering ends without its final events (`message_stop`,
`[DONE]`, `response.completed`): the Python SDKs raise from the stream's iteration (earlier anthropic
2.x releases: `httpx2.RemoteProtocolError`, "peer closed connection without sending complete message
body", not an `APIError`; 2.17.0 wraps the same failed read as `APIConnectionError`); either way the
answer is lost and the harness retries the call; a call not yet answering gets `APIConnectionError`.
Retries meet connection refused (`APIConnectionError`) until the restarted proxy listens again on the
same port, typically a few seconds later (measured by tests/integration/test_proxy_restart.py and the
fault suite); its keys, trees and routes come back from Redis.

The retry then carries exactly the history of the lost call. An output is committed to the tree (and
written to Redis) just before its final events are sent, so the lost call may or may not have left a
record. If it did not, the retry is an ordinary call. If it did, the harness never received that output,
and sampling again would leave the tree with an output no harness saw next to the one it sees. So a call
whose whole history matches recorded nodes and whose last message already has an output leaf (one no
later request continued) is answered with that output, token for token, without calling an engine; the
tree's commit finds it identical and stores nothing (`deduplicated`). The same holds for any retry of a
call whose answer was cut off (a harness read timeout). `proxy.replay_unanswered_calls: false` turns it
off (then a harness that re-sends an identical history on purpose gets a new sample).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt

from gyre.trajectory import Node, PreparedCall
from gyre.trajectory.node import NodeKind
from services.proxy.generation import Finish


def unanswered_output(prepared: PreparedCall) -> Node | None:
    """The newest output leaf recorded under this request's full history, when nothing new is in it."""
    if prepared.new_messages or not prepared.matched or prepared.root is None:
        return None
    parent = prepared.matched[-1]
    leaves = [
        child
        for child in parent.child_nodes
        if child.kind is NodeKind.OUTPUT
        and not child.child_nodes
        and child.sampled is not None
        and child.agent_kind is prepared.agent_kind
        and child.request_kind is prepared.request_kind
    ]
    if not leaves:
        return None
    return max(leaves, key=lambda n: n.meta.finished_at_s if n.meta is not None else 0.0)


class ReplayedGeneration:
    """The recorded output of `node` as if an engine produced it now (the interface of `Generation`
    that a `ModelCall` uses)."""

    def __init__(self, node: Node, prompt_ids: npt.NDArray[np.int32], stop_token_ids: frozenset[int]) -> None:
        assert node.sampled is not None
        self.node = node
        self.prompt_ids = prompt_ids
        self.output_ids = [int(i) for i in node.token_ids[node.sampled]]
        self.logprobs = [float(x) for x in node.logprobs]
        meta = node.meta
        self.engine_ids = [meta.engine_id] if meta is not None and meta.engine_id else []
        self.weight_versions = (
            [str(meta.policy_version)] if meta is not None and meta.policy_version >= 0 else []
        )
        stopped = bool(self.output_ids) and self.output_ids[-1] in stop_token_ids
        self.finish: Finish | None = Finish("stop", self.output_ids[-1]) if stopped else Finish("length")
        self.cached_tokens = len(prompt_ids)
        self.routed_experts: npt.NDArray[np.int32] | None = None
        """The recorded output's routing is in the tree already."""
        self.first_token_at: float | None = None
        self.num_moves = 0
        self.kv_migrated_tokens = 0
        self.engine = None
        self.rid: str | None = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    async def run(self) -> AsyncIterator[list[int]]:
        self.first_token_at = time.monotonic()
        yield list(self.output_ids)
