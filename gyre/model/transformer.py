"""GyreLM: the small decoder-only transformer of the embedded default, in plain torch.

Pre-norm blocks of RMSNorm → multi-head attention with rotary positions → RMSNorm → SwiGLU MLP, a
final RMSNorm and an untied LM head. The parameter names are a contract (trainer, checkpoints,
weight updates and Megatron conversion rely on them):

    embed.weight                                  [V, d]
    layers.{i}.attn_norm.weight                   [d]
    layers.{i}.attn.{q,k,v,o}_proj.weight         [d, d]
    layers.{i}.mlp_norm.weight                    [d]
    layers.{i}.mlp.{gate,up}_proj.weight          [ffn, d]
    layers.{i}.mlp.down_proj.weight               [d, ffn]
    norm.weight                                   [d]
    lm_head.weight                                [V, d]

Two forwards share the same modules:

- training (packed): `logits = model(input_ids, position_ids, cu_seqlens)` over S rows concatenated
  into T tokens, block-diagonal causal attention, logits [T, V];
- serving (paged): `model.forward_paged(input_ids, cache, batch)` over B rows of new
  tokens attending K/V held in a `PagedKVCache` (see `gyre.model.paged`).

Rotary uses the "rotate half" layout (the first and second half of each head dim form the pairs), the
convention of Llama/Qwen in HF and of Megatron with `rotary_interleaved=False`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gyre.model.config import ModelConfig
from gyre.model.paged import PagedBatch, PagedKVCache
from gyre.model.tokenizer import ByteTokenizer
from gyre.rl.attention import packed_attention
from gyre.trajectory.tree_layout import TreeLayout


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


class Rotary(nn.Module):
    """cos/sin tables for positions 0..max_seq_len-1 (buffers, not parameters)."""

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Rotate `x` [..., H, D] at `position_ids` [...]."""
        cos = self.cos[position_ids].unsqueeze(-2).to(x.dtype)
        sin = self.sin[position_ids].unsqueeze(-2).to(x.dtype)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def _qkv(
        self, x: torch.Tensor, position_ids: torch.Tensor, rotary: Rotary
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shape = (*x.shape[:-1], self.num_heads, self.head_dim)
        q = rotary(self.q_proj(x).view(shape), position_ids)
        k = rotary(self.k_proj(x).view(shape), position_ids)
        v = self.v_proj(x).view(shape)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: list[int],
        rotary: Rotary,
        tree: TreeLayout | None = None,
    ) -> torch.Tensor:
        """Packed: x [T, d]; rows are `x[cu[s]:cu[s+1]]`; each row attends to itself only (causal, or
        ancestor-only in a tree row: `gyre.rl.attention.packed_attention`)."""
        q, k, v = self._qkv(x, position_ids, rotary)
        out = packed_attention(q, k, v, cu_seqlens, tree)
        projected: torch.Tensor = self.o_proj(out.reshape(x.shape))
        return projected

    def forward_paged(
        self,
        x: torch.Tensor,
        position_ids: torch.Tensor,
        rotary: Rotary,
        cache: PagedKVCache,
        layer: int,
        batch: PagedBatch,
    ) -> torch.Tensor:
        """Paged: x [B, Lq, d]; writes the new K/V into the pool, then attends `batch.read_slots`."""
        q, k, v = self._qkv(x, position_ids, rotary)
        flat_write = batch.write_slots.reshape(-1)
        cache.write(
            layer,
            flat_write,
            k.reshape(-1, self.num_heads, self.head_dim),
            v.reshape(flat_write.shape[0], -1, self.head_dim),
        )
        keys, values = cache.gather(layer, batch.read_slots)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys.transpose(1, 2).to(q.dtype),
            values.transpose(1, 2).to(q.dtype),
            attn_mask=batch.mask,
        )
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(x.shape))
        return projected


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(config.ffn_hidden, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)


class GyreLM(nn.Module):
    """The embedded model. Build with `GyreLM(config)` (then `init_weights(seed)`) or load a checkpoint."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.rotary = Rotary(config.head_dim, config.max_seq_len, config.rope_theta)
        # Embedding rows past the tokenizer's vocabulary are padding: they are never predicted, so
        # neither the engine nor the trainer can sample or score an id the tokenizer cannot decode.
        padding = torch.arange(config.vocab_size) >= ByteTokenizer().vocab_size
        self.register_buffer("padding_ids", padding, persistent=False)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(self.norm(h))
        return logits.masked_fill(self.padding_ids, torch.finfo(logits.dtype).min)

    @torch.no_grad()
    def init_weights(self, seed: int) -> GyreLM:
        """Deterministic init: N(0, 0.02), residual projections scaled by 1/sqrt(2 * num_layers)."""
        gen = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.config.num_layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                param.copy_(torch.randn(param.shape, generator=gen) * residual_std)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
        return self

    def _check_positions(self, position_ids: torch.Tensor) -> None:
        if position_ids.numel() and int(position_ids.max()) >= self.config.max_seq_len:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond max_seq_len={self.config.max_seq_len}; "
                "shorten the sequence or raise model.max_seq_len"
            )

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor | list[int],
        tree: TreeLayout | None = None,
    ) -> torch.Tensor:
        """Packed training forward: input_ids/position_ids [T], cu_seqlens [S+1] → logits [T, V];
        `tree` is the layout of tree-packed rows (None: every row is a path)."""
        if input_ids.dim() != 1 or position_ids.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and position_ids must both be 1-D [T]; got {tuple(input_ids.shape)} and "
                f"{tuple(position_ids.shape)}"
            )
        bounds = [
            int(c) for c in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)
        ]
        if not bounds or bounds[0] != 0 or bounds[-1] != input_ids.shape[0] or bounds != sorted(bounds):
            raise ValueError(
                f"cu_seqlens must be non-decreasing from 0 to T={input_ids.shape[0]}; got {bounds[:4]}..."
            )
        self._check_positions(position_ids)
        h = self.embed(input_ids)
        for layer in self.layers:
            assert isinstance(layer, Block)
            h = h + layer.attn(layer.attn_norm(h), position_ids, bounds, self.rotary, tree)
            h = h + layer.mlp(layer.mlp_norm(h))
        return self._logits(h)

    def forward_paged(
        self,
        input_ids: torch.Tensor,
        cache: PagedKVCache,
        batch: PagedBatch,
        last_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Serving forward: input_ids [B, Lq] at `batch.positions` → logits [B, Lq, V], or [B, V] at
        the query index `last_index[b]` of each row when given (the only position a step samples)."""
        self._check_positions(batch.positions)
        h = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Block)
            h = h + layer.attn.forward_paged(
                layer.attn_norm(h), batch.positions, self.rotary, cache, i, batch
            )
            h = h + layer.mlp(layer.mlp_norm(h))
        if last_index is not None:
            h = h[torch.arange(h.shape[0]), last_index]
        return self._logits(h)


def build_model(config: ModelConfig, seed: int = 0) -> GyreLM:
    """A freshly initialized model in eval mode."""
    return GyreLM(config).init_weights(seed).eval()
