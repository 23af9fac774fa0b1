"""HF ↔ Megatron weight mapping: bit-exact round trips at TP 1 and 2 for every family, Megatron's
interleaved QKV and gate/up layouts spelled out, and strict names (pure torch, no process group)."""

from __future__ import annotations

import pytest
import torch

from gyre.model.files import check_model_dir
from gyre.model.weights import load_state_dict
from gyre.trainer.backends.megatron.weights import hf_names, hf_to_megatron, megatron_to_hf, tp_partition_dim
from tests.unit.megatron.helpers import FAMILIES, family_dir


def _load(family: str) -> tuple[object, dict[str, torch.Tensor]]:
    info = check_model_dir(family_dir(family))
    return info.arch, load_state_dict(info)


@pytest.mark.parametrize("fused_norms", [False, True])
@pytest.mark.parametrize("tp_size", [1, 2])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_round_trip_is_bit_exact(family: str, tp_size: int, fused_norms: bool) -> None:
    arch, tensors = _load(family)
    assert sorted(hf_names(arch)) == sorted(tensors)
    shards = [
        hf_to_megatron(arch, tensors, tp_rank=r, tp_size=tp_size, fused_norms=fused_norms)
        for r in range(tp_size)
    ]
    back = megatron_to_hf(arch, shards, fused_norms=fused_norms)
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    for name, t in shards[0].items():  # shards split what they should, replicate the rest
        dim = tp_partition_dim(name)
        if dim is not None and tp_size > 1:
            assert not torch.equal(t, shards[1][name]), name
        elif dim is None:
            assert torch.equal(t, shards[-1][name]), name


def test_qkv_is_interleaved_per_query_group_and_fc1_is_gate_then_up_per_rank() -> None:
    arch, tensors = _load("qwen2")  # 4 heads, 2 groups, head_dim 16
    h = "model.layers.0."
    q, k, v = (tensors[f"{h}self_attn.{p}_proj.bias"] for p in "qkv")
    rank1 = hf_to_megatron(arch, tensors, tp_rank=1, tp_size=2)
    # group 1 on rank 1: q heads 2 and 3, then k head 1, then v head 1
    assert torch.equal(
        rank1["decoder.layers.0.self_attention.linear_qkv.bias"], torch.cat([q[32:64], k[16:32], v[16:32]])
    )
    gate, up = tensors[f"{h}mlp.gate_proj.weight"], tensors[f"{h}mlp.up_proj.weight"]
    assert torch.equal(rank1["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate[64:], up[64:]]))
    assert torch.equal(
        rank1["decoder.layers.0.self_attention.linear_proj.weight"],
        tensors[f"{h}self_attn.o_proj.weight"][:, 32:],
    )


def test_names_are_strict() -> None:
    arch, tensors = _load("llama")
    with pytest.raises(ValueError, match="missing"):
        hf_to_megatron(
            arch, {k: v for k, v in tensors.items() if k != "lm_head.weight"}, tp_rank=0, tp_size=1
        )
    with pytest.raises(ValueError, match="unexpected"):
        hf_to_megatron(arch, {**tensors, "model.rotary_emb.inv_freq": torch.zeros(8)}, tp_rank=0, tp_size=1)
    tied_arch, tied = _load("qwen3")
    state = {
        **tied,
        "lm_head.weight": tied["model.embed_tokens.weight"].clone(),
    }  # as state_dict() reports it
    hf_to_megatron(tied_arch, state, tp_rank=0, tp_size=1)
    state["lm_head.weight"] += 1.0
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        hf_to_megatron(tied_arch, state, tp_rank=0, tp_size=1)
