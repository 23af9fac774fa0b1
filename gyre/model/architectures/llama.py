"""`LlamaForCausalLM`: the attention_bias (q/k/v/o) and mlp_bias switches, untied embeddings by default."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from gyre.model.architectures.base import Architecture, Flag, Switches


class Llama(Architecture):
    name = "llama"
    hf_class = "LlamaForCausalLM"
    model_type = "llama"
    chat_family = "llama3"
    config_defaults = MappingProxyType(
        {
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 2048,
            "attention_bias": False,
            "mlp_bias": False,
        }
    )

    def switches(self, flag: Flag) -> Switches:
        attention_bias = flag("attention_bias")
        return Switches(qkv_bias=attention_bias, o_bias=attention_bias, mlp_bias=flag("mlp_bias"))

    def init_config(self, num_layers: int) -> dict[str, Any]:
        return {
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "pretraining_tp": 1,
        }
