"""A device-agnostic core attention for megatron-core layer specs: torch SDPA, packed rows honoured.

Why: megatron-core's local `DotProductAttention` builds its masks and softmax on CUDA and refuses
`packed_seq_params`; Transformer Engine's attention needs a GPU. This module has
`DotProductAttention`'s constructor signature, so it drops into
`SelfAttentionSubmodules(core_attention=...)` of a layer spec, and runs wherever torch does.

Packed micro-steps (Gyre's rows, each with positions from 0) arrive as Megatron's `thd` layout:
`Attention` squeezes q/k/v to [t, heads, head_dim], applies rotary per row from
`packed_seq_params.cu_seqlens_q`, and hands the same `packed_seq_params` here. The rows are then
attended one by one with a causal SDPA each — a block-diagonal causal mask without materializing a
[T, T] mask, so memory stays proportional to the longest row. Without `packed_seq_params` the input is
the usual [s, b, heads, head_dim] and one causal SDPA runs over the batch. GQA is SDPA's
`enable_gqa` (query head h reads key/value group h // (heads / groups), Megatron's grouping).

    spec.submodules.self_attention.submodules.core_attention = PackedSDPAttention
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor


class PackedSDPAttention(MegatronModule):
    """Causal self-attention core over packed rows (see the module docstring)."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        if attn_mask_type != AttnMaskType.causal:
            raise ValueError(f"PackedSDPAttention is causal only; got attn_mask_type {attn_mask_type}")
        if config.context_parallel_size != 1:
            raise ValueError("PackedSDPAttention does not implement context parallelism")
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ValueError(
                "PackedSDPAttention has no attention dropout (training needs a deterministic model)"
            )
        self.layer_number = layer_number
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        )

    def _causal(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """[..., heads, L, d] → causal attention with GQA."""
        return F.scaled_dot_product_attention(
            query,
            key,
            value,
            is_causal=True,
            scale=self.softmax_scale,
            enable_gqa=key.shape[-3] != query.shape[-3],
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> Tensor:
        if attention_bias is not None:
            raise ValueError("PackedSDPAttention takes no attention_bias")
        if packed_seq_params is None:
            # [s, b, h, d] -> [b, h, s, d] -> [s, b, h * d]
            out = self._causal(*(x.permute(1, 2, 0, 3) for x in (query, key, value)))
            return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(
                f"packed_seq_params.qkv_format must be 'thd'; got {packed_seq_params.qkv_format!r}"
            )
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        if bounds[-1] != query.shape[0] or packed_seq_params.cu_seqlens_kv.tolist() != bounds:
            raise ValueError(
                "packed_seq_params: cu_seqlens_q and cu_seqlens_kv must both cover the packed tokens"
            )
        rows = [
            self._causal(query[a:b].transpose(0, 1), key[a:b].transpose(0, 1), value[a:b].transpose(0, 1))
            for a, b in pairwise(bounds)
        ]
        # [h, L, d] per row -> [t, h * d]
        return torch.cat([r.transpose(0, 1) for r in rows], dim=0).reshape(query.shape[0], -1)
