"""Rotary position embeddings for the kinds Llama / Qwen checkpoints ship: default, linear, llama3, yarn.

The inverse frequencies and the attention scaling follow transformers' `modeling_rope_utils`
formula by formula, and cos/sin are computed the way its rotary modules compute them (float32
`positions × inv_freq`, then `cos`/`sin` times the scaling), so log-probs agree with a
`transformers` forward to float32 rounding — computing tables in float64 instead shifts angles by
~1e-4 at position 4k. Layout is "rotate half" (pairs are the first and second half of a head).

    rope = Rotary(arch.rope, arch.head_dim)
    cos, sin = rope.cos_sin(position_ids)          # [..., 1, head_dim], sin with the rotation's signs
    q = apply_rotary(q, cos, sin)                  # q [..., heads, head_dim]
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gyre.model.arch import RopeSpec


def inv_freq_and_scaling(spec: RopeSpec, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2] float32, attention scaling applied to cos/sin)."""
    dim = head_dim
    base = spec.theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if spec.kind == "default":
        return inv_freq, 1.0
    if spec.kind == "linear":
        return inv_freq / spec.factor, 1.0
    if spec.kind == "llama3":
        return _llama3(inv_freq, spec), 1.0
    if spec.kind == "yarn":
        return _yarn(spec, dim)
    raise ValueError(f"unsupported rope kind {spec.kind!r}")


def _llama3(inv_freq: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    assert spec.low_freq_factor is not None and spec.high_freq_factor is not None
    assert spec.original_max_position_embeddings is not None
    factor, low, high = spec.factor, spec.low_freq_factor, spec.high_freq_factor
    old_context = spec.original_max_position_embeddings
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(spec: RopeSpec, dim: int) -> tuple[torch.Tensor, float]:
    assert spec.original_max_position_embeddings is not None
    base, factor = spec.theta, spec.factor
    original = spec.original_max_position_embeddings

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention = spec.attention_factor
    if attention is None:
        if spec.mscale and spec.mscale_all_dim:
            attention = get_mscale(factor, spec.mscale) / get_mscale(factor, spec.mscale_all_dim)
        else:
            attention = get_mscale(factor)
    beta_fast = spec.beta_fast or 32.0
    beta_slow = spec.beta_slow or 1.0

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, float(attention)


class Rotary(nn.Module):
    """cos/sin of positions for one head size (buffers, never parameters or state-dict entries)."""

    def __init__(self, spec: RopeSpec, head_dim: int) -> None:
        super().__init__()
        inv_freq, self.scaling = inv_freq_and_scaling(spec, head_dim)
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._table: tuple[tuple[object, ...], torch.Tensor, torch.Tensor] | None = None

    def cos_sin(
        self, position_ids: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [..., 1, head_dim] at `position_ids` [...], ready to broadcast over heads.

        transformers rotates as `x·cos + rotate_half(x)·sin` with rotate_half(x) = (−x₂, x₁); here
        the minus sign is folded into the first half of `sin`, so `apply_rotary` needs no negation
        (the same products, in the same order: bit-identical)."""
        freqs = position_ids.to(torch.float32).unsqueeze(-1) * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(-2)
        cos, sin = emb.cos() * self.scaling, emb.sin() * self.scaling
        half = sin.shape[-1] // 2
        sin[..., :half].neg_()
        return cos.to(dtype), sin.to(dtype)

    def cached_cos_sin(
        self, position_ids: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`cos_sin` read from tables of every position up to the largest seen (kept, grown by
        doubling): serving asks for a few positions per step, and two lookups cost less than the dozen
        ops that compute them. The tables are `cos_sin` of `arange`, so the values are the same."""
        needed = int(position_ids.max()) + 1 if position_ids.numel() else 1
        key = (dtype, self.inv_freq.dtype, self.inv_freq.data_ptr())
        table = self._table
        if table is None or table[0] != key or table[1].shape[0] < needed:
            size = max(1024, 1 << (needed - 1).bit_length())
            cos, sin = self.cos_sin(torch.arange(size), dtype)
            table = self._table = (key, cos.squeeze(-2), sin.squeeze(-2))
        return F.embedding(position_ids, table[1]).unsqueeze(-2), F.embedding(
            position_ids, table[2]
        ).unsqueeze(-2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` [..., H, D] by `cos_sin`'s cos/sin: x·cos + (x₂, x₁)·sin (three ops, no copies of
    cos/sin per head)."""
    swapped = torch.roll(x, shifts=x.shape[-1] // 2, dims=-1)
    return torch.addcmul(x * cos, swapped, sin)
