"""MoE routing in the trajectory tree: the experts the engine chose for each token, kept per node.

With routing replay on (`cell_agent.trainer.routing_replay`) the proxy asks the engine for the
experts of every token it forwarded (SGLang's `return_routed_experts`: the prompt and every output
but the last, [P + O - 1, L·k]) and the commit spreads them over the call's root-to-leaf path: each
node keeps the rows of its own tokens (`Node.routed_experts`, [num_tokens, L·k] int16, -1 where not
known), so a prefix shared by many calls carries its routing once, as it carries its tokens once. A
node keeps the rows it already knows (the first call that forwarded a token decided its experts, and
the tokens sampled after it depend on that choice); rows it did not know yet (an output's last token
and closing ids, forwarded only by the next call) are filled by later calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gyre.trajectory.node import Node

ROUTING_DTYPE = np.int16
"""Expert ids stored per token and layer slot (every MoE checkpoint has fewer than 32,768 experts)."""


def known_rows(routing: npt.NDArray[np.int16]) -> npt.NDArray[np.bool_]:
    """[n] true where a token's row holds an expert (a row of -1 only: not known)."""
    return np.asarray((routing >= 0).any(axis=1))


def spread_routing(nodes: Sequence[Node], routed: npt.NDArray[np.integer] | None) -> list[Node]:
    """Give the nodes of one call's path (root first, output last) their rows of `routed` — the
    engine's rows for the path's tokens in order, possibly fewer than the path holds — and return the
    existing nodes whose routing changed (to persist again; new nodes are persisted anyway)."""
    if routed is None:
        return []
    rows = np.asarray(routed)
    if rows.ndim != 2 or rows.shape[1] == 0:
        raise ValueError(f"routed experts must be [tokens, layers·k]; got shape {rows.shape}")
    total = sum(n.num_tokens for n in nodes)
    if len(rows) > total:
        raise ValueError(f"routed experts cover {len(rows)} tokens; the call's path holds {total}")
    width = rows.shape[1]
    changed: list[Node] = []
    pos = 0
    for node in nodes:
        n = node.num_tokens
        part = np.full((n, width), -1, dtype=ROUTING_DTYPE)
        got = rows[pos : pos + n]
        part[: len(got)] = got
        pos += n
        if node.routed_experts is None:
            if known_rows(part).any():
                node.routed_experts = part
                changed.append(node)
            continue
        if node.routed_experts.shape != part.shape:
            raise ValueError(
                f"node {node.node_id} holds routing of width {node.routed_experts.shape[1]}, the call {width}"
            )
        fill = ~known_rows(node.routed_experts) & known_rows(part)
        if fill.any():
            node.routed_experts[fill] = part[fill]
            changed.append(node)
    return changed
