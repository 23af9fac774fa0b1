"""HF config.json → GPTArchitecture, and bad models or layouts refused with the field named (pure
Python: no process group, no megatron import), plus the rope kinds against transformers' own."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from gyre.trainer.backends.megatron import architecture_from_hf, check_parallel_layout
from tests.unit.megatron.helpers import hf_model


def _config(family: str = "qwen3", **overrides: Any) -> dict[str, Any]:
    return {**hf_model(family).config.to_dict(), **overrides}


def test_families_parse_to_their_flags() -> None:
    qwen3, llama, qwen2 = (architecture_from_hf(_config(f)) for f in ("qwen3", "llama", "qwen2"))
    assert (qwen3.qk_layernorm, qwen3.qkv_bias, qwen3.tie_word_embeddings) == (True, False, True)
    assert (llama.qk_layernorm, llama.qkv_bias, llama.tie_word_embeddings) == (False, False, False)
    assert (qwen2.qk_layernorm, qwen2.qkv_bias) == (False, True)
    assert (qwen3.num_attention_heads, qwen3.num_query_groups, qwen3.head_dim) == (4, 2, 16)
    assert llama.rope.kind == "llama3" and llama.rope.original_max_position_embeddings == 32


def test_old_config_dialect_reads_rope_theta_and_rope_scaling() -> None:
    config = _config("llama")
    del config["rope_parameters"]
    config.update(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    rope = architecture_from_hf(config).rope
    assert (rope.kind, rope.theta, rope.factor) == ("linear", 5e5, 2.0)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"model_type": "mistral"}, "model_type 'mistral'"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
            "rope_parameters.rope_type 'dynamic'",
        ),
        (
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
            "rope_parameters.rope_type 'longrope'",
        ),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "rope_parameters.factor"),
        (
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e4,
                    "factor": 2.0,
                    "original_max_position_embeddings": 16,
                    "attention_factor": 1.3,
                }
            },
            "rope_parameters.attention_factor",
        ),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"attention_dropout": 0.1}, "attention_dropout"),
        ({"vocab_size": None}, "vocab_size"),
    ],
)
def test_unsupported_models_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("(", r"\(")):
        architecture_from_hf(_config(**overrides))
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("overrides", "tp", "field"),
    [
        ({"num_attention_heads": 6, "num_key_value_heads": 6, "head_dim": 16}, 4, "num_attention_heads 6"),
        ({}, 4, "num_key_value_heads 2"),
        ({"vocab_size": 511}, 2, "vocab_size 511"),
        ({"intermediate_size": 130, "num_key_value_heads": 4}, 4, "intermediate_size 130"),
    ],
)
def test_layouts_megatron_cannot_split_name_the_field(overrides: dict[str, Any], tp: int, field: str) -> None:
    arch = architecture_from_hf(_config(**overrides))
    with pytest.raises(ValueError, match=field):
        check_parallel_layout(arch, tensor_parallel_size=tp)
    check_parallel_layout(architecture_from_hf(_config()), tensor_parallel_size=2)
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        check_parallel_layout(
            architecture_from_hf(_config()), tensor_parallel_size=1, pipeline_parallel_size=2
        )
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 1e6},
        {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 16},
        {
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 8.0,
            "original_max_position_embeddings": 64,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
            "beta_fast": 16,
            "truncate": False,
        },
    ],
)
def test_rope_kinds_equal_transformers(rope: dict[str, Any]) -> None:
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        _yarn_get_concentration_factor_from_config,
    )

    from gyre.trainer.backends.megatron.model import transformer_config
    from gyre.trainer.backends.megatron.rotary import GyreRotaryEmbedding

    model = hf_model("qwen3", rope_parameters=rope)
    arch = architecture_from_hf(model.config.to_dict())
    want, attention_factor = (
        ROPE_INIT_FUNCTIONS[rope["rope_type"]](model.config, torch.device("cpu"))
        if rope["rope_type"] != "default"
        else (model.model.rotary_emb.inv_freq, 1.0)
    )
    mine = GyreRotaryEmbedding(
        arch.rope, kv_channels=arch.head_dim, device=torch.device("cpu"), cp_group=None
    )
    torch.testing.assert_close(mine.inv_freq, want.float(), rtol=1e-6, atol=0.0)
    config = transformer_config(arch, tp_size=1, params_dtype=torch.float32, use_te=False)
    assert _yarn_get_concentration_factor_from_config(config) == pytest.approx(attention_factor, rel=1e-12)
