"""Reference block-diagonal causal attention for the packed (varlen) layout of a micro-step.

A micro-step concatenates S rows into T tokens; `cu_seqlens` [S+1] marks the row boundaries
(flash-attn varlen style). Token t may attend to token s only when both lie in the same row and
s <= t, so each row is computed exactly as if it were alone. The embedded model may call
`block_causal_attention` for its packed path; flash-attn's `flash_attn_varlen_func` computes the same
thing on GPUs.

Shapes follow flash-attn varlen: q [T, H, D], k and v [T, H_kv, D] (H_kv divides H: grouped-query
attention repeats each key/value head H/H_kv times), output [T, H, D_v].

    out = block_causal_attention(q, k, v, cu_seqlens)
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F


def _check_cu_seqlens(cu_seqlens: torch.Tensor, num_tokens: int) -> list[int]:
    bounds: list[int] = [int(b) for b in cu_seqlens.tolist()]
    if not bounds or bounds[0] != 0 or bounds[-1] != num_tokens:
        raise ValueError(
            f"cu_seqlens must start at 0 and end at the token count {num_tokens}; got {bounds[:4]}..."
        )
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError("cu_seqlens must be strictly increasing (no empty rows)")
    return bounds


def block_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[T, T] bool: entry (t, s) is True when query t may attend key s (same row, s <= t)."""
    num_tokens = int(cu_seqlens[-1]) if cu_seqlens.numel() else 0
    _check_cu_seqlens(cu_seqlens, num_tokens)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    row = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu_seqlens.device), lengths)
    pos = torch.arange(num_tokens, device=cu_seqlens.device)
    return (row[:, None] == row[None, :]) & (pos[None, :] <= pos[:, None])


def block_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal softmax attention inside each row of the packed sequence; rows never see each other.

    `scale` defaults to 1/sqrt(D). Each row is one causal `scaled_dot_product_attention` call, so the
    cost is Σ L_r² rather than T².
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("q, k and v must be [T, heads, head_dim]")
    num_tokens, num_heads, _ = q.shape
    num_kv_heads = k.shape[1]
    if k.shape[0] != num_tokens or v.shape[0] != num_tokens or v.shape[1] != num_kv_heads:
        raise ValueError("q, k and v must have the same token count, and k and v the same head count")
    if num_heads % num_kv_heads:
        raise ValueError(f"kv heads ({num_kv_heads}) must divide query heads ({num_heads})")
    bounds = _check_cu_seqlens(cu_seqlens, num_tokens)
    groups = num_heads // num_kv_heads
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    if num_tokens == 0:
        return q.new_empty(0, num_heads, v.shape[2])
    parts = [
        F.scaled_dot_product_attention(
            q[a:b].transpose(0, 1),
            k[a:b].transpose(0, 1),
            v[a:b].transpose(0, 1),
            is_causal=True,
            scale=scale,
        ).transpose(0, 1)
        for a, b in itertools.pairwise(bounds)
    ]
    return torch.cat(parts, dim=0)
