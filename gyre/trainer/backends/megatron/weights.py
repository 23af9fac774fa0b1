"""Hugging Face ↔ megatron-core weights of a Llama / Qwen2 / Qwen3 GPTModel, per tensor-parallel rank.

Why our own mapping: the maintained bridges do not fit. Megatron-Bridge ≥ 0.4 needs Python 3.12 and
0.3.x pins transformers < 5 and Transformer Engine; mbridge 0.15 accepts megatron-core 0.16 and any
transformers, but builds its models with the TE spec, moves them to `torch.cuda.current_device()`,
reads the global `parallel_state` and loads from a checkpoint path, so it runs neither on CPU nor on
a cell's own TP group. The layout rules are small:

    embedding.word_embeddings.weight          model.embed_tokens.weight           rows split (vocab)
    output_layer.weight                       lm_head.weight (absent when tied)   rows split (vocab)
    decoder.final_layernorm.weight            model.norm.weight                   replicated
    L.input_layernorm.weight                  l.input_layernorm.weight            replicated
    L.self_attention.linear_qkv.weight/bias   l.self_attn.{q,k,v}_proj.*          per query group g:
                                                                                  [q heads of g; k_g; v_g],
                                                                                  groups split over ranks
    L.self_attention.{q,k}_layernorm.weight   l.self_attn.{q,k}_norm.weight       replicated (Qwen3)
    L.self_attention.linear_proj.weight       l.self_attn.o_proj.weight           columns split
    L.pre_mlp_layernorm.weight                l.post_attention_layernorm.weight   replicated
    L.mlp.linear_fc1.weight                   l.mlp.{gate,up}_proj.weight         rank r: [gate_r; up_r]
    L.mlp.linear_fc2.weight                   l.mlp.down_proj.weight              columns split

(L = decoder.layers.i, l = model.layers.i.) With the Transformer Engine spec the two per-layer norms
live inside the fused linears (`linear_qkv.layer_norm_weight`, `linear_fc1.layer_norm_weight`);
`fused_norms=True` maps those names. Conversion is slicing and concatenation only, so a round trip
HF → Megatron (any TP) → HF is bit-exact.

    shard = hf_to_megatron(arch, hf_tensors, tp_rank=r, tp_size=n)       # this rank's named parameters
    hf = megatron_to_hf(arch, [shard_0, ..., shard_n-1])                  # full HF names and shapes
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from gyre.model.arch import ModelArch

_REPLICATED_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
}
_FUSED_NORM_NAMES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}


def tp_partition_dim(megatron_name: str) -> int | None:
    """The dimension a Megatron parameter is split along over TP ranks (None: replicated norms)."""
    if megatron_name.endswith(("layernorm.weight", "layer_norm_weight")):
        return None
    if megatron_name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    return 0


def _layer_names(arch: ModelArch, fused_norms: bool) -> dict[str, str]:
    """Megatron suffix → HF suffix of the one-to-one tensors of a layer (the fused ones are separate)."""
    names = {(_FUSED_NORM_NAMES[m] if fused_norms else m): h for m, h in _REPLICATED_LAYER.items()}
    if arch.qk_norm:
        names["self_attention.q_layernorm.weight"] = "self_attn.q_norm.weight"
        names["self_attention.k_layernorm.weight"] = "self_attn.k_norm.weight"
    return names


def hf_names(arch: ModelArch) -> list[str]:
    """Every HF tensor name of `arch` (what `hf_to_megatron` needs and `megatron_to_hf` returns)."""
    return list(arch.parameter_shapes())


def check_hf_tensors(arch: ModelArch, hf: Mapping[str, Tensor]) -> None:
    """`ValueError` naming the first missing or unexpected tensor (a tied `lm_head.weight` equal to the
    embedding, as `state_dict()` reports it, is accepted)."""
    expected = set(hf_names(arch))
    extra = set(hf) - expected
    if arch.tie_word_embeddings and "lm_head.weight" in extra:
        if not torch.equal(hf["lm_head.weight"], hf["model.embed_tokens.weight"]):
            raise ValueError(
                "lm_head.weight differs from model.embed_tokens.weight but tie_word_embeddings is true"
            )
        extra.discard("lm_head.weight")
    missing = sorted(expected - set(hf))
    if missing or extra:
        raise ValueError(
            f"HF weights do not match the config: missing {missing[:3]}, unexpected {sorted(extra)[:3]}"
        )


def _qkv_groups(arch: ModelArch, q: Tensor, k: Tensor, v: Tensor) -> list[Tensor]:
    """Per query group g: [q heads of g; k_g; v_g] along dim 0 (works for weights and biases)."""
    per = arch.num_heads // arch.num_kv_heads
    qs = q.reshape(arch.num_kv_heads, per * arch.head_dim, *q.shape[1:])
    ks = k.reshape(arch.num_kv_heads, arch.head_dim, *k.shape[1:])
    vs = v.reshape(arch.num_kv_heads, arch.head_dim, *v.shape[1:])
    return [torch.cat((qs[g], ks[g], vs[g])) for g in range(arch.num_kv_heads)]


def hf_to_megatron(
    arch: ModelArch, hf: Mapping[str, Tensor], *, tp_rank: int, tp_size: int, fused_norms: bool = False
) -> dict[str, Tensor]:
    """The named Megatron parameters of TP rank `tp_rank` (new tensors; `hf` is not modified)."""
    check_hf_tensors(arch, hf)

    def rows(t: Tensor) -> Tensor:
        return t.chunk(tp_size, dim=0)[tp_rank].clone()

    def cols(t: Tensor) -> Tensor:
        return t.chunk(tp_size, dim=1)[tp_rank].clone()

    out = {
        "embedding.word_embeddings.weight": rows(hf["model.embed_tokens.weight"]),
        "decoder.final_layernorm.weight": hf["model.norm.weight"].clone(),
    }
    if not arch.tie_word_embeddings:
        out["output_layer.weight"] = rows(hf["lm_head.weight"])
    groups_per_rank = arch.num_kv_heads // tp_size
    mine = slice(tp_rank * groups_per_rank, (tp_rank + 1) * groups_per_rank)
    for i in range(arch.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        for m_name, h_name in _layer_names(arch, fused_norms).items():
            out[m + m_name] = hf[h + h_name].clone()
        kinds = ("weight", "bias") if arch.qkv_bias else ("weight",)
        for kind in kinds:
            q, k, v = (hf[f"{h}self_attn.{p}_proj.{kind}"] for p in "qkv")
            out[f"{m}self_attention.linear_qkv.{kind}"] = torch.cat(_qkv_groups(arch, q, k, v)[mine])
        out[m + "self_attention.linear_proj.weight"] = cols(hf[h + "self_attn.o_proj.weight"])
        out[m + "mlp.linear_fc1.weight"] = torch.cat(
            (rows(hf[h + "mlp.gate_proj.weight"]), rows(hf[h + "mlp.up_proj.weight"]))
        )
        out[m + "mlp.linear_fc2.weight"] = cols(hf[h + "mlp.down_proj.weight"])
    return out


def megatron_to_hf(
    arch: ModelArch, shards: Sequence[Mapping[str, Tensor]], *, fused_norms: bool = False
) -> dict[str, Tensor]:
    """Full HF tensors from the named parameters of every TP rank, in rank order (replicated tensors
    are taken from rank 0). `lm_head.weight` is left out when tied, as `save_pretrained` does."""
    if not shards:
        raise ValueError("megatron_to_hf needs the parameters of at least one TP rank")
    first = shards[0]

    def rows(name: str) -> Tensor:
        return torch.cat([s[name] for s in shards], dim=0)

    def cols(name: str) -> Tensor:
        return torch.cat([s[name] for s in shards], dim=1)

    out = {
        "model.embed_tokens.weight": rows("embedding.word_embeddings.weight"),
        "model.norm.weight": first["decoder.final_layernorm.weight"].clone(),
    }
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = rows("output_layer.weight")
    per = arch.num_heads // arch.num_kv_heads
    q_size = per * arch.head_dim
    for i in range(arch.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        for m_name, h_name in _layer_names(arch, fused_norms).items():
            out[h + h_name] = first[m + m_name].clone()
        for kind in ("weight", "bias") if arch.qkv_bias else ("weight",):
            fused = rows(f"{m}self_attention.linear_qkv.{kind}")
            grouped = fused.reshape(arch.num_kv_heads, q_size + 2 * arch.head_dim, *fused.shape[1:])
            q, k, v = grouped.split((q_size, arch.head_dim, arch.head_dim), dim=1)
            for name, t in (("q", q), ("k", k), ("v", v)):
                out[f"{h}self_attn.{name}_proj.{kind}"] = t.reshape(-1, *fused.shape[1:]).clone()
        out[h + "self_attn.o_proj.weight"] = cols(m + "self_attention.linear_proj.weight")
        halves = [s[m + "mlp.linear_fc1.weight"].chunk(2, dim=0) for s in shards]
        out[h + "mlp.gate_proj.weight"] = torch.cat([g for g, _ in halves], dim=0)
        out[h + "mlp.up_proj.weight"] = torch.cat([u for _, u in halves], dim=0)
        out[h + "mlp.down_proj.weight"] = cols(m + "mlp.linear_fc2.weight")
    return out
