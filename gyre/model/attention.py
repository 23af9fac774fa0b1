"""Attention of the packed (varlen) layout of a micro-step: block-diagonal causal for path rows,
ancestor-only for tree rows. The packed forward of a model delegates its attention here.

A micro-step concatenates S rows into T tokens; `cu_seqlens` [S+1] marks the row boundaries
(flash-attn varlen style) and no token attends outside its row. In a path row (`tree=None`, or a
row of one segment) token t attends every s <= t of its row: one causal `scaled_dot_product_attention`
per row, so the cost is Σ L_r², never T². In a tree row (`gyre.model.tree_layout`) token t
attends s iff s is on t's own root-to-leaf path and s <= t, so every token sees exactly what it
sees in its path row, and each shared prefix is computed once.

How a tree row is computed, exactly and without a [L, L] mask: the row splits into one chain per
leaf (contiguous in tree order); the queries of a chain attend the chain's *context* (the tokens of
its ancestors, gathered) plus the chain causally. The first chain of a row has no context: one
causal SDPA. Every other chain is two SDPAs merged by their log-sum-exps, the way split-KV flash
attention merges key blocks: the chain's queries over the context (no mask: every query sees all of
it) and over the chain itself (causal, whose kernel skips the masked half). With o_c, lse_c and
o_s, lse_s the two outputs and row log-sum-exps, lse = logaddexp(lse_c, lse_s) and
o = e^(lse_c - lse) o_c + e^(lse_s - lse) o_s is exactly the softmax over the union. The backward is
exact too, and needs no gradient of an lse: the flash backward of each part, run with the merged
output and the merged lse, gives that part's share of dq and its own dk, dv (the softmax
probabilities of a part are e^(s - lse) with the merged lse, and D = rowsum(do * o) is the merged
one). So the work is the number of (query, visible key) pairs, nothing computed and masked away.

Measured on the bench's Appendix-C-shaped step (`gyre bench tree-train`, 2 executions, 4 layers of
4 heads x 32, forward + backward, one thread, torch profiler): the attention kernels of the tree step
take time in proportion to its (query, key) pairs, 17.6 M against 27.4 M for the same trajectories'
path rows (1.4 s against 2.3 s). The former kernel (chains in masked query blocks of 256) spent 0.76 s
beside its kernels on zero-filled gradients, one [H, T, D] per block and input in the backward of
its slices, and on masks; merged, that is 0.16 s, and the step went from 1.27x to 1.75x faster than
path rows.

On CPU the two parts are `aten::_scaled_dot_product_flash_attention_for_cpu` (the kernel SDPA
dispatches to there, which also returns the lse) and its backward. On other devices the chain
falls back to one SDPA over context + chain with a boolean mask (exact; no lse merge; untested: no
GPU where this was built).

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
    # [H, T, D]: SDPA's layout. Rows and chains are contiguous spans of T: split (one cat in the
    # backward) rather than slice (a zero-filled [H, T, D] gradient per slice).
    qh, kh, vh = (x.transpose(0, 1) for x in (q, k, v))
    if tree is None or tree.is_paths:
        lengths = [b - a for a, b in itertools.pairwise(bounds)]
        spans = zip(*(x.split(lengths, dim=1) for x in (qh, kh, vh)), strict=True)
        parts = [_sdpa(qs, ks, vs, is_causal=True, scale=scale) for qs, ks, vs in spans]
    else:
        chains = tree.chains()
        lengths = [c.end - c.start for c in chains]
        spans = zip(chains, *(x.split(lengths, dim=1) for x in (qh, kh, vh)), strict=True)
        parts = [_chain_attention(qs, ks, vs, kh, vh, chain, scale) for chain, qs, ks, vs in spans]
    return torch.cat(parts, dim=1).transpose(0, 1)


def _chain_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    all_k: torch.Tensor,
    all_v: torch.Tensor,
    chain: Chain,
    scale: float | None,
) -> torch.Tensor:
    """Output [H, n, D] of a chain's queries `q` (its own keys `k`, values `v`; the context is
    gathered from `all_k`, `all_v`, [H, T, D])."""
    if len(chain.context) == 0:
        return _sdpa(q, k, v, is_causal=True, scale=scale)
    context = torch.from_numpy(np.ascontiguousarray(chain.context)).to(q.device)
    context_k, context_v = all_k.index_select(1, context), all_v.index_select(1, context)
    if q.device.type == "cpu":
        return _ContextThenCausal.apply(q[None], context_k[None], context_v[None], k[None], v[None], scale)[0]
    return _masked_context_attention(q, context_k, context_v, k, v, scale)


def _masked_context_attention(
    q: torch.Tensor,
    context_k: torch.Tensor,
    context_v: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
) -> torch.Tensor:
    """`_ContextThenCausal` of [H, n, D] inputs as one SDPA with a boolean mask, for devices other
    than the CPU (computes the masked half of the chain's own block too)."""
    num_context, n = context_k.shape[1], q.shape[1]
    columns = torch.arange(num_context + n, device=q.device)
    mask = columns[None, :] <= torch.arange(n, device=q.device)[:, None] + num_context
    keys, values = torch.cat([context_k, k], dim=1), torch.cat([context_v, v], dim=1)
    return _sdpa(q, keys, values, attn_mask=mask, scale=scale)


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class _ContextThenCausal(torch.autograd.Function):
    """Softmax attention of queries [1, H, n, D] over context keys (all visible) then their own n
    keys (causal), as two flash kernels merged by log-sum-exp (see the module docstring). CPU only."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        q: torch.Tensor,
        context_k: torch.Tensor,
        context_v: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None,
    ) -> torch.Tensor:
        out_c, lse_c = _flash(q, context_k, context_v, 0.0, False, scale=scale)
        out_s, lse_s = _flash(q, k, v, 0.0, True, scale=scale)
        lse = torch.logaddexp(lse_c, lse_s)
        out = out_c * torch.exp(lse_c - lse)[..., None] + out_s * torch.exp(lse_s - lse)[..., None]
        out = out.to(q.dtype)
        ctx.save_for_backward(q, context_k, context_v, k, v, out, lse)
        ctx.scale = scale  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        q, context_k, context_v, k, v, out, lse = ctx.saved_tensors  # type: ignore[attr-defined]
        grad_out = grad_out.contiguous()
        scale = ctx.scale  # type: ignore[attr-defined]
        dq_c, dk_c, dv_c = _flash_backward(
            grad_out, q, context_k, context_v, out, lse, 0.0, False, scale=scale
        )
        dq_s, dk_s, dv_s = _flash_backward(grad_out, q, k, v, out, lse, 0.0, True, scale=scale)
        return dq_c + dq_s, dk_c, dv_c, dk_s, dv_s, None


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
