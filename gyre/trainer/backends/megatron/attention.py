"""The core attention of the megatron backend's layer spec: Gyre's packed attention (path and tree
rows) with RoPE at each token's own position, on any device.

Why our own core attention: megatron-core's local `DotProductAttention` builds its masks and softmax on
CUDA and refuses `packed_seq_params`; Transformer Engine's needs a GPU. And Megatron's RoPE derives
positions from `cu_seqlens` (0.. in every row), which is right for a path row but not for a
tree-packed row (`gyre.model.tree_layout`), where a token's position is its depth along its own
root-to-leaf path. So the model is built with `position_embedding_type="none"` and this module, which
has `DotProductAttention`'s constructor signature and drops into
`SelfAttentionSubmodules(core_attention=...)`, does both steps itself:

1. RoPE of q and k at the micro-step's `position_ids` (`gyre.model.rope`: every HF rope kind,
   YaRN's attention factor included — the cos/sin the torch backend uses, computed once per forward
   in `model.packed_logits`);
2. `gyre.model.attention.packed_attention`: causal per path row, ancestor-only in a tree row, without
   a [T, T] mask — the torch backend's attention, so both backends train the same rows the same way.

Megatron's `Attention` hands q/k/v here already projected (fused QKV, this TP rank's heads), Qwen3's
q/k norms applied, squeezed to [t, heads, head_dim] because `packed_seq_params.qkv_format` is `thd`.
What the rows look like travels in `GyrePackedSeqParams`, Megatron's `PackedSeqParams` plus the
positions' cos/sin and the tree layout (the parameter Megatron passes through to the core attention
unchanged). GQA: query head h reads key/value group h // (heads / groups), Megatron's grouping.

    spec.submodules.self_attention.submodules.core_attention = PackedCoreAttention
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from gyre.model.attention import packed_attention
from gyre.model.rope import apply_rotary
from gyre.model.tree_layout import TreeLayout


@dataclass
class GyrePackedSeqParams(PackedSeqParams):
    """`thd` packing of a micro-step plus what Gyre's attention needs: each token's RoPE cos/sin
    [T, 1, head_dim] (signed sin, `gyre.model.rope.Rotary.cos_sin`), the row bounds on the host and the
    tree layout of tree-packed rows (None: every row is a path)."""

    rope_cos: Tensor | None = None
    rope_sin: Tensor | None = None
    bounds: list[int] | None = None
    tree: TreeLayout | None = None


class PackedCoreAttention(MegatronModule):
    """RoPE + packed attention over a micro-step's rows (see the module docstring)."""

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
            raise ValueError(f"PackedCoreAttention is causal only; got attn_mask_type {attn_mask_type}")
        if config.context_parallel_size != 1:
            raise ValueError("PackedCoreAttention does not implement context parallelism")
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ValueError(
                "PackedCoreAttention has no attention dropout (training needs a deterministic model)"
            )
        self.layer_number = layer_number
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
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
        """q [t, heads, d], k/v [t, groups, d] → [t, heads · d]."""
        if attention_bias is not None:
            raise ValueError("PackedCoreAttention takes no attention_bias")
        if not isinstance(packed_seq_params, GyrePackedSeqParams) or packed_seq_params.qkv_format != "thd":
            raise ValueError(
                "PackedCoreAttention needs GyrePackedSeqParams(qkv_format='thd'); run the model through "
                "gyre.trainer.backends.megatron.model.packed_logits"
            )
        params = packed_seq_params
        assert params.rope_cos is not None and params.rope_sin is not None and params.bounds is not None
        q = apply_rotary(query, params.rope_cos, params.rope_sin)
        k = apply_rotary(key, params.rope_cos, params.rope_sin)
        out = packed_attention(q, k, value, params.bounds, params.tree, scale=self.softmax_scale)
        return out.reshape(query.shape[0], -1)
