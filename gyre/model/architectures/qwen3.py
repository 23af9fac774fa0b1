"""`Qwen3ForCausalLM` (dense): RMSNorm on each head of q and k before rotary, an explicit head_dim."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from gyre.model.architectures.base import Architecture, Flag, Switches


class Qwen3(Architecture):
    name = "qwen3"
    hf_class = "Qwen3ForCausalLM"
    model_type = "qwen3"
    chat_family = "qwen3"
    config_defaults = MappingProxyType(
        {
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768,
            "attention_bias": False,
            "head_dim": 128,
        }
    )
    default_num_kv_heads = 32

    def switches(self, flag: Flag) -> Switches:
        attention_bias = flag("attention_bias")
        return Switches(qkv_bias=attention_bias, o_bias=attention_bias, qk_norm=True)

    def init_config(self, num_layers: int) -> dict[str, Any]:
        return {
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": num_layers,
            "attention_bias": False,
        }
