"""What a Hugging Face `config.json` of a dense Llama / Qwen2 / Qwen3 model means for a megatron-core
`GPTModel`, and whether a parallel layout can build it — checked before any process group starts.

Pure Python (no torch.distributed, no megatron import), so the caller can validate a run's model and
layout at config time and exit 2 on a `ValueError`; every message names the offending field:

    arch = architecture_from_hf(json.loads(Path("model/config.json").read_text()))
    check_parallel_layout(arch, tensor_parallel_size=2)      # ValueError naming the field, or None

The three families differ only in flags: Qwen2 has q/k/v biases, Qwen3 has per-head RMSNorm on q and
k, any of them may tie the LM head to the embedding. Both config dialects are read: transformers 5's
`rope_parameters` ({rope_theta, rope_type, ...}) and the older `rope_theta` + `rope_scaling`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

FAMILIES = ("llama", "qwen2", "qwen3")
RopeKind = Literal["default", "linear", "llama3", "yarn"]
ROPE_KINDS: tuple[RopeKind, ...] = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """Rotary embedding of the model, in Hugging Face's terms."""

    kind: RopeKind
    theta: float
    factor: float = 1.0
    """linear / llama3 / yarn scaling factor."""
    low_freq_factor: float = 1.0
    """llama3."""
    high_freq_factor: float = 4.0
    """llama3."""
    original_max_position_embeddings: int = 0
    """llama3 and yarn: the context length the model was pretrained with."""
    beta_fast: float = 32.0
    """yarn."""
    beta_slow: float = 1.0
    """yarn."""
    mscale: float | None = None
    """yarn: numerator scale of the attention factor (with `mscale_all_dim`)."""
    mscale_all_dim: float | None = None
    """yarn: denominator scale of the attention factor."""
    truncate: bool = True
    """yarn: round the correction range to whole dimensions."""


@dataclass(frozen=True, slots=True)
class GPTArchitecture:
    """The shape and flags of a dense decoder, everything a GPTModel and the weight mapping need."""

    family: str
    vocab_size: int
    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    """Key/value heads (GQA)."""
    head_dim: int
    norm_eps: float
    qkv_bias: bool
    qk_layernorm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope: RopeSpec


def _field(config: Mapping[str, Any], name: str, kind: type, default: Any = None) -> Any:
    value = config.get(name, default)
    if value is None:
        raise ValueError(f"config.json: {name} is required by the megatron backend")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"config.json: {name} must be a positive integer; got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError(f"config.json: {name} must be a number; got {value!r}")
    return value


def _refuse_true(config: Mapping[str, Any], name: str, why: str) -> None:
    if config.get(name):
        raise ValueError(
            f"config.json: {name}={config[name]!r} is not supported by the megatron backend ({why})"
        )


def rope_from_hf(config: Mapping[str, Any]) -> RopeSpec:
    """The rotary embedding of `config` (either dialect); refuses kinds megatron-core cannot express."""
    if config.get("rope_parameters"):
        params, where = dict(config["rope_parameters"]), "rope_parameters"
        theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    else:
        params, where = dict(config.get("rope_scaling") or {}), "rope_scaling"
        theta = config.get("rope_theta", 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_KINDS:
        raise ValueError(
            f"config.json: {where}.rope_type {kind!r} is not supported by the megatron backend; "
            f"supported: {', '.join(ROPE_KINDS)}"
        )
    if float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ValueError(f"config.json: {where}.partial_rotary_factor must be 1.0 for the megatron backend")
    if not isinstance(theta, int | float) or theta <= 0:
        raise ValueError(f"config.json: {where}.rope_theta must be a positive number; got {theta!r}")

    def number(key: str, default: float | None = None) -> float:
        value = params.get(key, default)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise ValueError(
                f"config.json: {where}.{key} must be a positive number for rope_type {kind!r}; got {value!r}"
            )
        return float(value)

    if kind == "default":
        return RopeSpec("default", float(theta))
    if kind == "linear":
        return RopeSpec("linear", float(theta), factor=number("factor"))
    original = int(number("original_max_position_embeddings", config.get("original_max_position_embeddings")))
    if kind == "llama3":
        low, high = number("low_freq_factor", 1.0), number("high_freq_factor", 4.0)
        if high <= low:
            raise ValueError(f"config.json: {where}.high_freq_factor must exceed low_freq_factor")
        return RopeSpec(
            "llama3",
            float(theta),
            factor=number("factor"),
            low_freq_factor=low,
            high_freq_factor=high,
            original_max_position_embeddings=original,
        )
    if params.get("attention_factor") is not None:
        raise ValueError(
            f"config.json: {where}.attention_factor is not supported by the megatron backend "
            "(megatron-core derives YaRN's attention factor from factor, mscale and mscale_all_dim)"
        )
    factor = params.get("factor")
    if factor is None:
        factor = _field(config, "max_position_embeddings", int) / original
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    both = bool(mscale) and bool(mscale_all_dim)  # transformers uses the ratio only when both are non-zero
    return RopeSpec(
        "yarn",
        float(theta),
        factor=float(factor),
        original_max_position_embeddings=original,
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=float(mscale) if both else None,
        mscale_all_dim=float(mscale_all_dim) if both else None,
        truncate=bool(params.get("truncate", True)),
    )


def architecture_from_hf(config: Mapping[str, Any]) -> GPTArchitecture:
    """Parse and check an HF config.json dict; `ValueError` naming the field for anything unsupported."""
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ValueError(
            f"config.json: model_type {family!r} is not supported by the megatron backend; supported: {', '.join(FAMILIES)}"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"config.json: hidden_act {config['hidden_act']!r} is not supported (the megatron backend builds SwiGLU)"
        )
    _refuse_true(
        config, "attention_bias", "megatron-core has q/k/v biases only together with biases on every linear"
    )
    _refuse_true(config, "mlp_bias", "the families served have no MLP biases")
    _refuse_true(config, "use_sliding_window", "sliding-window attention is not built")
    if any(t != "full_attention" for t in config.get("layer_types") or []):
        raise ValueError("config.json: layer_types must all be 'full_attention' for the megatron backend")
    if float(config.get("attention_dropout") or 0.0) != 0.0:
        raise ValueError("config.json: attention_dropout must be 0 (training needs a deterministic model)")
    if int(config.get("pretraining_tp") or 1) != 1:
        raise ValueError("config.json: pretraining_tp must be 1")
    heads = _field(config, "num_attention_heads", int)
    groups = _field(config, "num_key_value_heads", int, heads)
    if heads % groups:
        raise ValueError(
            f"config.json: num_attention_heads {heads} must be a multiple of num_key_value_heads {groups}"
        )
    hidden = _field(config, "hidden_size", int)
    head_dim = config.get("head_dim") or hidden // heads
    _field({"head_dim": head_dim}, "head_dim", int)
    eps = float(_field(config, "rms_norm_eps", float))
    if not 0 < eps < 1 or math.isnan(eps):
        raise ValueError(f"config.json: rms_norm_eps must be in (0, 1); got {eps}")
    return GPTArchitecture(
        family=family,
        vocab_size=_field(config, "vocab_size", int),
        hidden_size=hidden,
        ffn_hidden_size=_field(config, "intermediate_size", int),
        num_layers=_field(config, "num_hidden_layers", int),
        num_attention_heads=heads,
        num_query_groups=groups,
        head_dim=int(head_dim),
        norm_eps=eps,
        qkv_bias=family == "qwen2",
        qk_layernorm=family == "qwen3",
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=_field(config, "max_position_embeddings", int, 4096),
        rope=rope_from_hf(config),
    )


def check_parallel_layout(
    arch: GPTArchitecture, *, tensor_parallel_size: int, pipeline_parallel_size: int = 1
) -> None:
    """`ValueError` naming the field when megatron-core cannot split `arch` over the layout."""
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1; got {tensor_parallel_size}")
    if pipeline_parallel_size != 1:
        raise ValueError(
            f"pipeline_parallel_size {pipeline_parallel_size} is not supported: megatron-core 0.16's pipeline "
            "schedules allocate on CUDA, and the Gyre objective needs a micro-step's logits in one process; use 1"
        )
    tp = tensor_parallel_size
    for field_name, value in (
        ("num_attention_heads", arch.num_attention_heads),
        ("num_key_value_heads", arch.num_query_groups),
        ("vocab_size", arch.vocab_size),
        ("intermediate_size", arch.ffn_hidden_size),
    ):
        if value % tp:
            raise ValueError(
                f"config.json: {field_name} {value} is not divisible by tensor_parallel_size {tp}; "
                f"pick a tensor_parallel_size that divides it"
            )
