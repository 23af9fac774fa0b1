"""`Qwen2ForCausalLM`: bias on q/k/v (not o), grouped-query attention by default."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from gyre.model.architectures.base import Architecture, Flag, Switches


class Qwen2(Architecture):
    name = "qwen2"
    hf_class = "Qwen2ForCausalLM"
    model_type = "qwen2"
    chat_family = "qwen2"
    config_defaults = MappingProxyType({"rms_norm_eps": 1e-6, "max_position_embeddings": 32768})
    default_num_kv_heads = 32

    def switches(self, flag: Flag) -> Switches:
        attention_bias = flag("attention_bias")
        return Switches(qkv_bias=True, o_bias=attention_bias)

    def init_config(self, num_layers: int) -> dict[str, Any]:
        return {
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": num_layers,
        }
