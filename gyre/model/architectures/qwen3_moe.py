"""`Qwen3MoeForCausalLM`: Qwen3's attention with mixture-of-experts MLPs (`gyre.model.arch.MoeSpec`).

Sparse layers route each token to `num_experts_per_tok` of `num_experts` SwiGLU experts (the router's
float32 softmax, top-k, renormalized when `norm_topk_prob`); `decoder_sparse_step` and `mlp_only_layers`
keep some layers dense. The experts are read by `gyre.model.arch.read_moe`, which refuses what Gyre does
not compute (the router's load-balancing loss, shared experts).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from gyre.model.architectures.base import Architecture, Flag, Switches


class Qwen3Moe(Architecture):
    name = "qwen3_moe"
    hf_class = "Qwen3MoeForCausalLM"
    model_type = "qwen3_moe"
    chat_family = "qwen3"
    config_defaults = MappingProxyType(
        {
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768,
            "attention_bias": False,
            "intermediate_size": 6144,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 768,
            "norm_topk_prob": False,
            "decoder_sparse_step": 1,
            "output_router_logits": False,
        }
    )
    default_num_kv_heads = 4
    experts = True

    def switches(self, flag: Flag) -> Switches:
        attention_bias = flag("attention_bias")
        return Switches(qkv_bias=attention_bias, o_bias=attention_bias, qk_norm=True)

    def init_config(self, num_layers: int) -> dict[str, Any]:
        """Qwen3-30B-A3B's routing (top-k renormalized, every layer sparse) at a tiny width: 8 experts of
        96, 2 per token, whatever the size preset."""
        return {
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": num_layers,
            "attention_bias": False,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 96,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        }
