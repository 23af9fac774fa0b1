"""A megatron-core `GPTModel` built from a `GPTArchitecture`, and its packed logits function.

The model is Megatron's own GPTModel, TransformerBlock, SelfAttention (fused QKV, column/row-parallel
linears, vocab-parallel embedding and LM head) and MLP (SwiGLU: gated_linear_unit + silu), configured
from the HF config. What makes it run on a CPU machine, without patching the library:

- the layer spec's core attention is `PackedSDPAttention` (megatron's local one calls CUDA);
- `transformer_impl="local"`, every fusion off, `use_cpu_initialization=True`;
- the rotary module is `GyreRotaryEmbedding` (Megatron's calls CUDA), swapped in by the subclass;
- the process groups come in a `ProcessGroupCollection` (the cell's TP group, single-rank groups for
  the rest), so megatron's global `parallel_state` is never initialized and the cells' world stays
  the caller's.

On CUDA with Transformer Engine importable, the TE layer spec is used instead (flash/cuDNN attention
takes the same `thd` PackedSeqParams); that path is untested here (no GPU).

Packed rows: `packed_logits` passes the micro-step as one [1, T] sequence with
`PackedSeqParams(qkv_format="thd", cu_seqlens=...)`; Megatron applies RoPE per row from cu_seqlens
(positions restart at 0 in each row, which is the micro-step contract, checked), and the core
attention attends per row. Under TP the LM head's logits are vocab-parallel; they are all-gathered
with Megatron's `gather_from_tensor_model_parallel_region`, whose backward hands each rank the
gradient of its own vocab slice, so the loss and its gradient are exact on every rank.

    model = build_gpt_model(arch, tp_group=group, device=torch.device("cpu"), params_dtype=torch.float32)
    logits = packed_logits(model, input_ids, position_ids, cu_seqlens)      # [T, V]
"""

from __future__ import annotations

import dataclasses
import importlib.util

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.layers import (
    set_defaults_if_not_set_tensor_model_parallel_attributes,
    set_tensor_model_parallel_attributes,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from gyre.trainer.backends.megatron.architecture import GPTArchitecture
from gyre.trainer.backends.megatron.attention import PackedSDPAttention
from gyre.trainer.backends.megatron.rotary import GyreRotaryEmbedding
from gyre.trainer.backends.megatron.weights import tp_partition_dim


@dataclasses.dataclass
class YarnTransformerConfig(TransformerConfig):
    """TransformerConfig plus the YaRN fields megatron's `Attention` reads for the attention factor
    (`_yarn_get_concentration_factor_from_config`); only YaRN models use it."""

    yarn_rotary_scaling_factor: float = 1.0
    yarn_mscale: float | None = None
    yarn_mscale_all_dim: float | None = None


def uses_transformer_engine(device: torch.device) -> bool:
    """The TE layer spec on CUDA when Transformer Engine is installed, else the local spec + SDPA."""
    return device.type == "cuda" and importlib.util.find_spec("transformer_engine") is not None


def transformer_config(
    arch: GPTArchitecture, *, tp_size: int, params_dtype: torch.dtype, use_te: bool
) -> TransformerConfig:
    """The megatron TransformerConfig of `arch`: no dropout, no fusions, no biases but Qwen2's q/k/v."""
    kwargs: dict[str, object] = dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp_size,
        pipeline_model_parallel_size=1,
        context_parallel_size=1,
        sequence_parallel=False,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=True,
        perform_initialization=False,  # every weight is loaded from the HF checkpoint right after
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        transformer_impl="transformer_engine" if use_te else "local",
    )
    if arch.rope.kind == "yarn":
        return YarnTransformerConfig(
            **kwargs,  # type: ignore[arg-type]
            yarn_rotary_scaling_factor=arch.rope.factor,
            yarn_mscale=arch.rope.mscale,
            yarn_mscale_all_dim=arch.rope.mscale_all_dim,
        )
    return TransformerConfig(**kwargs)  # type: ignore[arg-type]


def layer_spec(arch: GPTArchitecture, *, use_te: bool) -> ModuleSpec:
    """Megatron's GPT layer spec; the local one gets `PackedSDPAttention` as its core attention."""
    if use_te:
        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=arch.qk_layernorm)
    spec = get_gpt_layer_local_spec(qk_layernorm=arch.qk_layernorm, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = PackedSDPAttention
    return spec


def process_groups(tp_group: dist.ProcessGroup) -> ProcessGroupCollection:
    """The model's groups: `tp_group` for tensor parallelism, a group of this rank alone for the rest."""
    alone = dist.new_group([dist.get_rank()], use_local_synchronization=True)
    groups = ProcessGroupCollection()
    groups.tp = tp_group
    for name in ("pp", "cp", "embd", "pos_embd", "dp", "dp_cp"):
        setattr(groups, name, alone)
    groups.tp_cp = tp_group
    groups.mp = tp_group
    return groups


class GyreGPTModel(GPTModel):
    """GPTModel with RoPE from `GyreRotaryEmbedding` (HF rope kinds, any device)."""

    def __init__(
        self,
        arch: GPTArchitecture,
        config: TransformerConfig,
        spec: ModuleSpec,
        pg_collection: ProcessGroupCollection,
        device: torch.device,
    ) -> None:
        super().__init__(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=arch.vocab_size,
            max_sequence_length=arch.max_position_embeddings,
            parallel_output=True,
            share_embeddings_and_output_weights=arch.tie_word_embeddings,
            position_embedding_type="rope",
            pg_collection=pg_collection,
        )
        self.arch = arch
        self.rotary_pos_emb = GyreRotaryEmbedding(
            arch.rope, kv_channels=arch.head_dim, device=device, cp_group=pg_collection.cp
        )


def build_gpt_model(
    arch: GPTArchitecture, *, tp_group: dist.ProcessGroup, device: torch.device, params_dtype: torch.dtype
) -> GyreGPTModel:
    """The (uninitialized) model shard of this TP rank, on `device`; load weights before use."""
    use_te = uses_transformer_engine(device)
    config = transformer_config(arch, tp_size=tp_group.size(), params_dtype=params_dtype, use_te=use_te)
    model = GyreGPTModel(arch, config, layer_spec(arch, use_te=use_te), process_groups(tp_group), device)
    model = model.to(
        device=device, dtype=params_dtype
    )  # the local spec builds its norms in the default dtype
    for name, p in model.named_parameters():
        # Megatron sets these only when it initializes weights itself (perform_initialization), yet its
        # optimizer's norm and the clip here read them.
        dim = tp_partition_dim(name)
        if dim is None:
            set_defaults_if_not_set_tensor_model_parallel_attributes(p)
        elif hasattr(p, "tensor_model_parallel"):
            assert p.tensor_model_parallel and p.partition_dim == dim, name
        else:
            set_tensor_model_parallel_attributes(p, is_parallel=True, dim=dim, stride=1)
    return model


class GatherVocab(torch.autograd.Function):
    """Forward: all-gather the last dim over `group` (rank order); backward: this rank's slice."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, shard: Tensor, group: dist.ProcessGroup) -> Tensor:
        parts = [torch.empty_like(shard) for _ in range(group.size())]
        dist.all_gather(parts, shard.contiguous(), group=group)
        ctx.group, ctx.width = group, shard.shape[-1]  # type: ignore[attr-defined]
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        rank, width = ctx.group.rank(), ctx.width  # type: ignore[attr-defined]
        return grad[..., rank * width : (rank + 1) * width].contiguous(), None


def check_row_positions(position_ids: Tensor, cu_seqlens: Tensor) -> None:
    """`ValueError` unless positions restart at 0 in every row (the thd RoPE derives them from cu_seqlens)."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    starts = torch.repeat_interleave(cu_seqlens[:-1].to(torch.int64), lengths)
    expected = torch.arange(position_ids.shape[0], device=position_ids.device) - starts.to(
        position_ids.device
    )
    if not torch.equal(position_ids.to(torch.int64), expected):
        raise ValueError(
            "position_ids must restart at 0 in every row of cu_seqlens (the packed micro-step layout)"
        )


def packed_logits(model: GyreGPTModel, input_ids: Tensor, position_ids: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Full-vocabulary logits [T, V] of a packed micro-step (block-diagonal causal attention)."""
    check_row_positions(position_ids, cu_seqlens)
    device = next(model.parameters()).device
    cu = cu_seqlens.to(device=device, dtype=torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    packed = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest
    )
    ids = input_ids.to(device=device, dtype=torch.int64)[None]
    logits = model(ids, position_ids.to(device)[None], None, packed_seq_params=packed)[0]  # [T, V / tp]
    if model.pg_collection.tp.size() > 1:
        logits = GatherVocab.apply(logits, model.pg_collection.tp)
    return logits
