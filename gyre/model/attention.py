"""Attention of the packed (varlen) layout of a micro-step: block-diagonal causal for path rows,
ancestor-only for tree rows. The packed forward of a model delegates its attention here.

A micro-step concatenates S rows into T tokens; `cu_seqlens` [S+1] marks the row boundaries
(flash-attn varlen style) and no token attends outside its row. In a path row (`tree=None`, or a
row of one segment) token t attends every s <= t of its row: one causal `scaled_dot_product_attention`
per row, so the cost is Σ L_r², never T². In a tree row (`gyre.model.tree_layout`) token t
attends s iff s is on t's own root-to-leaf path and s <= t, so every token sees exactly what it
sees in its path row, and each shared prefix is computed once.

How a tree row is computed, exactly and without a [L, L] mask: the row splits into one chain per
leaf (contiguous in tree order); the queries of a chain attend the chain's context (the tokens of
its ancestors, gathered) plus the chain causally. The first chain of a row has no context: one
causal SDPA. Each other chain runs in query blocks of `_QUERY_BLOCK` tokens, each block one SDPA
over context + chain-so-far with a boolean mask that is all-true but for its last, lower-triangular
block. The work is the number of (query, ancestor) pairs plus a sliver per block; the CPU SDPA
kernel computes masked entries too, so the blocks are what keeps it from growing to
L_chain × (context + L_chain). Measured on an Appendix-C-shaped row (5,494 tokens, 5 chains, 4 heads
of 32, forward + backward, CPU seconds, one thread): 0.5-0.57 s with blocks of 256 (128-1024 within
~25% of it, one SDPA per chain 0.88 s), 2.6 s with one dense boolean mask over the row, and 2.3 s
for the causal attention of its five path rows (10,759 tokens).

SDPA is always called on 4-D [1, H, L, D] views: given 3-D inputs, torch 2.13's CPU dispatch takes
the unfused math path (the [L, L] scores materialized), 18x slower forward and 5.6x slower forward +
backward than its flash kernel at L = 5,000 (and 3.3x with a boolean mask), measured here.

Why not flex attention: in torch 2.13 it has no backward on CPU (NotImplementedError "FlexAttention
does not support backward on CPU"), and the trainer needs one. The dense mask stays the reference
(`packed_attention_mask`, for tests).

Shapes follow flash-attn varlen: q [T, H, D], k and v [T, H_kv, D] (H_kv divides H: grouped-query
attention repeats each key/value head H/H_kv times), output [T, H, D_v].

    out = packed_attention(q, k, v, cu_seqlens)                 # path rows
    out = packed_attention(q, k, v, cu_seqlens, step.tree)      # any row may be a tree row
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from gyre.model.tree_layout import Chain, TreeLayout

_QUERY_BLOCK = 256
"""Queries per SDPA call in a chain with context (see the module docstring)."""


def _bounds(cu_seqlens: Sequence[int] | torch.Tensor, num_tokens: int) -> list[int]:
    bounds = [int(b) for b in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    if not bounds or bounds[0] != 0 or bounds[-1] != num_tokens:
        raise ValueError(
            f"cu_seqlens must start at 0 and end at the token count {num_tokens}; got {bounds[:4]}..."
        )
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError("cu_seqlens must be strictly increasing (no empty rows)")
    return bounds


def packed_attention_mask(
    cu_seqlens: Sequence[int] | torch.Tensor, tree: TreeLayout | None = None
) -> torch.Tensor:
    """[T, T] bool reference: entry (t, s) is True when query t attends key s."""
    if tree is not None:
        return torch.from_numpy(tree.mask())
    bounds = _bounds(cu_seqlens, int(cu_seqlens[-1]) if len(cu_seqlens) else 0)
    lengths = torch.tensor(list(itertools.starmap(lambda a, b: b - a, itertools.pairwise(bounds))))
    row = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    pos = torch.arange(bounds[-1])
    return (row[:, None] == row[None, :]) & (pos[None, :] <= pos[:, None])


def block_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[T, T] bool: entry (t, s) is True when query t may attend key s (same row, s <= t)."""
    return packed_attention_mask(cu_seqlens)


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: Sequence[int] | torch.Tensor,
    tree: TreeLayout | None = None,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Softmax attention of the packed rows: causal in path rows, ancestor-only in tree rows.

    `cu_seqlens` [S+1] are the row boundaries (a list or an int tensor); `tree` the layout of all S
    rows when any is a tree row (`MicroStep.tree`). `scale` defaults to 1/sqrt(D).
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("q, k and v must be [T, heads, head_dim]")
    num_tokens, num_heads, _ = q.shape
    num_kv_heads = k.shape[1]
    if k.shape[0] != num_tokens or v.shape[0] != num_tokens or v.shape[1] != num_kv_heads:
        raise ValueError("q, k and v must have the same token count, and k and v the same head count")
    if num_heads % num_kv_heads:
        raise ValueError(f"kv heads ({num_kv_heads}) must divide query heads ({num_heads})")
    bounds = _bounds(cu_seqlens, num_tokens)
    if tree is not None and tree.cu_seqlens().tolist() != bounds:
        raise ValueError("the tree layout must describe exactly the rows of cu_seqlens")
    groups = num_heads // num_kv_heads
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    if num_tokens == 0:
        return q.new_empty(0, num_heads, v.shape[2])
    # [H, T, D]: SDPA's layout; slices along T are views.
    qh, kh, vh = (x.transpose(0, 1) for x in (q, k, v))
    parts: list[torch.Tensor] = []
    if tree is None or tree.is_paths:
        for a, b in itertools.pairwise(bounds):
            parts.append(_sdpa(qh[:, a:b], kh[:, a:b], vh[:, a:b], is_causal=True, scale=scale))
    else:
        for chain in tree.chains():
            parts.extend(_chain_attention(qh, kh, vh, chain, scale))
    return torch.cat(parts, dim=1).transpose(0, 1)


def _chain_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chain: Chain, scale: float | None
) -> list[torch.Tensor]:
    """Outputs [H, n, D] for the chain's queries, in query blocks (see the module docstring)."""
    a, b = chain.start, chain.end
    if len(chain.context) == 0:
        return [_sdpa(q[:, a:b], k[:, a:b], v[:, a:b], is_causal=True, scale=scale)]
    context = torch.from_numpy(np.ascontiguousarray(chain.context)).to(q.device)
    keys = torch.cat([k.index_select(1, context), k[:, a:b]], dim=1)
    values = torch.cat([v.index_select(1, context), v[:, a:b]], dim=1)
    num_context = len(chain.context)
    out: list[torch.Tensor] = []
    for i0 in range(0, b - a, _QUERY_BLOCK):
        i1 = min(i0 + _QUERY_BLOCK, b - a)
        num_keys = num_context + i1
        columns = torch.arange(num_keys, device=q.device)
        rows = torch.arange(i0, i1, device=q.device) + num_context
        mask = columns[None, :] <= rows[:, None]
        out.append(
            _sdpa(
                q[:, a + i0 : a + i1], keys[:, :num_keys], values[:, :num_keys], attn_mask=mask, scale=scale
            )
        )
    return out


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """SDPA of [H, L, D] inputs through its fused kernels (4-D views; see the module docstring)."""
    out = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=attn_mask, is_causal=is_causal, scale=scale
    )
    return out[0]


def block_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: Sequence[int] | torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """`packed_attention` of path rows only (each row causal, rows never see each other)."""
    return packed_attention(q, k, v, cu_seqlens, scale=scale)
