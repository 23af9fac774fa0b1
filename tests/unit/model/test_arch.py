"""config.json → ModelArch: the three families' switches, both RoPE spellings, and named refusals."""

from __future__ import annotations

from typing import Any

import pytest

from gyre.model.arch import ModelError, arch_from_config, read_arch
from tests.support.models import hf_dir

BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
}


def config(arch: str, **extra: Any) -> dict[str, Any]:
    return {"architectures": [arch], **BASE, **extra}


def test_family_switches() -> None:
    llama = arch_from_config(config("LlamaForCausalLM", attention_bias=True, mlp_bias=True))
    assert (llama.qkv_bias, llama.o_bias, llama.mlp_bias, llama.qk_norm) == (True, True, True, False)
    qwen2 = arch_from_config(config("Qwen2ForCausalLM"))
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm, qwen2.head_dim) == (True, False, False, 16)
    qwen3 = arch_from_config(config("Qwen3ForCausalLM", head_dim=32, tie_word_embeddings=True))
    assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.head_dim, qwen3.tie_word_embeddings) == (
        False,
        True,
        32,
        True,
    )
    assert "lm_head.weight" not in qwen3.parameter_shapes()
    assert qwen3.parameter_shapes()["model.layers.1.self_attn.q_norm.weight"] == (32,)
    assert qwen2.parameter_shapes()["model.layers.0.self_attn.k_proj.bias"] == (32,)


def test_rope_spellings_agree() -> None:
    legacy = arch_from_config(
        config("LlamaForCausalLM", rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    )
    v5 = arch_from_config(
        config("LlamaForCausalLM", rope_parameters={"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0})
    )
    assert legacy.rope == v5.rope and legacy.rope.kind == "linear" and legacy.rope.theta == 5e5
    yarn = arch_from_config(config("Qwen3ForCausalLM", rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    assert yarn.rope.original_max_position_embeddings == 2048  # transformers' default: max positions


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"architectures": ["MistralForCausalLM"]}, "architectures"),
        ({"architectures": ["Qwen2ForCausalLM", "LlamaForCausalLM"]}, "architectures"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling.rope_type"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.low_freq_factor"),
        ({"torch_dtype": "int8"}, "torch_dtype"),
        ({"hidden_size": "64"}, "hidden_size"),
        ({"rms_norm_eps": 0}, "rms_norm_eps"),
    ],
)
def test_unsupported_configs_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ModelError) as info:
        arch_from_config({**config("LlamaForCausalLM"), **change}, "m/config.json")
    assert info.value.field == field
    assert str(info.value).startswith(f"m/config.json: {field}: ")
    assert "\n" not in str(info.value)


def test_fingerprint_ignores_dtype_but_not_shapes() -> None:
    a = arch_from_config(config("LlamaForCausalLM", torch_dtype="float32"))
    assert (
        a.fingerprint() == arch_from_config(config("LlamaForCausalLM", torch_dtype="bfloat16")).fingerprint()
    )
    assert (
        a.fingerprint() != arch_from_config(config("LlamaForCausalLM", num_key_value_heads=4)).fingerprint()
    )


def test_read_arch_of_an_initialized_directory() -> None:
    arch = read_arch(hf_dir("qwen3"))
    assert arch.architecture == "Qwen3ForCausalLM" and arch.num_kv_heads == 2 and arch.tie_word_embeddings
    assert 1.7e6 < arch.num_parameters() < 2.0e6
