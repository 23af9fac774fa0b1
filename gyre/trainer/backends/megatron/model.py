"""A megatron-core `GPTModel` built from a `ModelArch`, and its packed logits function.

The model is Megatron's own GPTModel, TransformerBlock, SelfAttention (fused QKV, column/row-parallel
linears, vocab-parallel embedding and LM head) and MLP (SwiGLU: gated_linear_unit + silu), configured
from the HF config. What makes it run on a CPU machine and train Gyre's rows, without patching the
library:

- the layer spec's core attention is `attention.PackedCoreAttention` (RoPE at each token's own
  position, then the packed path/tree attention of `gyre.model.attention`); the model itself is
  built with `position_embedding_type="none"`, so Megatron applies no RoPE of its own;
- `transformer_impl="local"`, every fusion off, `use_cpu_initialization=True`;
- the process groups come in a `ProcessGroupCollection` (the cell's TP group, a group of this
  process alone for the rest), so megatron's global `parallel_state` is never initialized and the
  cells' torch.distributed world stays the cell agent's.

On CUDA with Transformer Engine importable, the TE layer spec is used for the linears and norms (its
fused input norms: `weights.py` `fused_norms`), with the same core attention; that path is untested
here (no GPU).

Packed rows: `packed_logits` passes the micro-step as one [1, T] sequence with
`GyrePackedSeqParams(qkv_format="thd", ...)` carrying the row bounds, the positions' cos/sin and the
tree layout. Under TP the LM head's logits are vocab-parallel; they are all-gathered by `GatherVocab`,
whose backward hands each rank the gradient of its own vocab slice, so the loss and its gradient are
exact on every rank.

    model = build_gpt_model(arch, tp_group=group, device=torch.device("cpu"), params_dtype=torch.float32)
    logits = packed_logits(model, input_ids, position_ids, cu_seqlens, tree)      # [T, V]
"""

from __future__ import annotations

import datetime
import importlib.util
import itertools
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.layers import (
    set_defaults_if_not_set_tensor_model_parallel_attributes,
    set_tensor_model_parallel_attributes,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from gyre.model.arch import ModelArch
from gyre.model.rope import Rotary
from gyre.model.tree_layout import TreeLayout
from gyre.trainer.backends.megatron.attention import GyrePackedSeqParams, PackedCoreAttention
from gyre.trainer.backends.megatron.weights import tp_partition_dim


def uses_transformer_engine(device: torch.device) -> bool:
    """The TE layer spec on CUDA when Transformer Engine is installed, else the local spec."""
    return device.type == "cuda" and importlib.util.find_spec("transformer_engine") is not None


def ensure_world(device: torch.device) -> None:
    """megatron-core 0.16 resolves its process groups only while torch.distributed's default world
    exists (`get_tensor_model_parallel_group_if_none` returns None otherwise, at build and at forward
    time): start a world of this process alone when there is none. A cell agent of a multi-cell run
    builds its trainer after joining the cells' world, so this only happens for a single cell."""
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def solo_group(device: torch.device) -> dist.ProcessGroup:
    """A group of this process alone, outside the torch.distributed world: gloo on a loopback device (a
    group of one talks to nobody), NCCL for CUDA tensors.

    The backend is wrapped in a `ProcessGroup`, as `dist.new_group` wraps its backends: megatron-core
    calls the group's coalesced collectives (`reduce_scatter_tensor_coalesced` under
    `_coalescing_manager` when its DDP reduces gradients on CUDA), which only `ProcessGroup` has; a bare
    `ProcessGroupNCCL` failed there on the first GPU run (bench/gpu.py)."""
    store = dist.HashStore()
    backend: Any
    if device.type == "cuda":
        backend_type = dist.ProcessGroup.BackendType.NCCL
        backend = dist.ProcessGroupNCCL(store, 0, 1, dist.ProcessGroupNCCL.Options())
    else:
        backend_type = dist.ProcessGroup.BackendType.GLOO
        options = dist.ProcessGroupGloo._Options()
        options._timeout = datetime.timedelta(seconds=60)
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        backend = dist.ProcessGroupGloo(store, 0, 1, options)
    group = dist.ProcessGroup(store, 0, 1)
    group._register_backend(torch.device(device.type), backend_type, backend)
    group._set_default_backend(backend_type)
    return group


def transformer_config(
    arch: ModelArch, *, tp_size: int, params_dtype: torch.dtype, use_te: bool
) -> TransformerConfig:
    """The megatron TransformerConfig of `arch`: no dropout, no fusions, no biases but Qwen2's q/k/v."""
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.intermediate_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
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


def layer_spec(arch: ModelArch, *, use_te: bool) -> ModuleSpec:
    """Megatron's GPT layer spec (TE or local) with `PackedCoreAttention` as its core attention."""
    if use_te:
        spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=arch.qk_norm)
    else:
        spec = get_gpt_layer_local_spec(qk_layernorm=arch.qk_norm, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = PackedCoreAttention
    return spec


def process_groups(tp_group: dist.ProcessGroup) -> ProcessGroupCollection:
    """The model's groups: `tp_group` for tensor parallelism, a group of this process alone for the rest."""
    alone = (
        tp_group
        if tp_group.size() == 1
        else dist.new_group([dist.get_rank()], use_local_synchronization=True)
    )
    groups = ProcessGroupCollection()
    groups.tp = tp_group
    for name in ("pp", "cp", "embd", "pos_embd", "dp", "dp_cp"):
        setattr(groups, name, alone)
    groups.tp_cp = tp_group
    groups.mp = tp_group
    return groups


class GyreGPTModel(GPTModel):
    """GPTModel without RoPE of its own (`PackedCoreAttention` applies it), plus the HF rotary of `arch`."""

    def __init__(
        self,
        arch: ModelArch,
        config: TransformerConfig,
        spec: ModuleSpec,
        pg_collection: ProcessGroupCollection,
    ) -> None:
        super().__init__(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=arch.vocab_size,
            max_sequence_length=arch.max_position_embeddings,
            parallel_output=True,
            share_embeddings_and_output_weights=arch.tie_word_embeddings,
            position_embedding_type="none",
            pg_collection=pg_collection,
        )
        self.arch = arch
        self.rotary = Rotary(arch.rope, arch.head_dim)


def build_gpt_model(
    arch: ModelArch, *, tp_group: dist.ProcessGroup, device: torch.device, params_dtype: torch.dtype
) -> GyreGPTModel:
    """The (uninitialized) model shard of this TP rank, on `device`; load weights before use."""
    use_te = uses_transformer_engine(device)
    config = transformer_config(arch, tp_size=tp_group.size(), params_dtype=params_dtype, use_te=use_te)
    model = GyreGPTModel(arch, config, layer_spec(arch, use_te=use_te), process_groups(tp_group))
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


def packed_logits(
    model: GyreGPTModel,
    input_ids: Tensor,
    position_ids: Tensor,
    cu_seqlens: Tensor,
    tree: TreeLayout | None = None,
) -> Tensor:
    """Full-vocabulary logits [T, V] of a packed micro-step: the logits contract of `gyre.rl.step_loss`
    (causal attention per path row, ancestor-only in tree rows, positions as given)."""
    if input_ids.dim() != 1 or position_ids.shape != input_ids.shape:
        raise ValueError("input_ids and position_ids must both be 1-D [T]")
    bounds = [int(b) for b in cu_seqlens.tolist()]
    if not bounds or bounds[0] != 0 or bounds[-1] != input_ids.shape[0]:
        raise ValueError(f"cu_seqlens must run from 0 to T={input_ids.shape[0]}; got {bounds[:4]}...")
    if position_ids.numel() and int(position_ids.max()) >= model.arch.max_position_embeddings:
        raise ValueError(
            f"position {int(position_ids.max())} is beyond max_position_embeddings="
            f"{model.arch.max_position_embeddings} of the model (config.json); shorten the sequence"
        )
    weight = model.embedding.word_embeddings.weight
    device = weight.device
    cos, sin = model.rotary.cos_sin(position_ids.to(device), weight.dtype)
    cu = cu_seqlens.to(device=device, dtype=torch.int32)
    longest = max(b - a for a, b in itertools.pairwise(bounds))
    packed = GyrePackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
        rope_cos=cos,
        rope_sin=sin,
        bounds=bounds,
        tree=tree,
    )
    ids = input_ids.to(device=device, dtype=torch.int64)[None]
    logits: Tensor = model(ids, None, None, packed_seq_params=packed)[0]  # [T, V / tp]
    if model.pg_collection.tp.size() > 1:
        logits = GatherVocab.apply(logits, model.pg_collection.tp)
    return logits
