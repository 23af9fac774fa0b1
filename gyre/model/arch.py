"""The architecture of a Hugging Face checkpoint, read from its `config.json` and checked once.

Gyre serves and trains one shared decoder: `LlamaForCausalLM`, `Qwen2ForCausalLM`,
`Qwen3ForCausalLM` (dense) and `Qwen3MoeForCausalLM` differ only in a few switches, which `ModelArch`
names and each architecture's record in `gyre/model/architectures/` sets from its config:

    GQA               num_key_value_heads divides num_attention_heads
    Qwen2             bias on q/k/v (not o)
    Qwen3             RMSNorm on each head of q and k (before rotary), explicit head_dim
    Qwen3-MoE         Qwen3's attention; sparse layers route each token to `num_experts_per_tok` of
                      `num_experts` SwiGLU experts (`MoeSpec`, read by `read_moe`)
    Llama             attention_bias (q/k/v/o) and mlp_bias switches
    all               tied or untied embeddings, RoPE with `rope_theta` and a scaling kind
                      (`default`, `linear`, `llama3`, `yarn`), RMSNorm eps, SwiGLU

Both spellings of RoPE settings are read: the legacy `rope_theta` + `rope_scaling` of the Hub's
configs and transformers 5's `rope_parameters`. Anything else (another architecture, sliding
window, a rope kind we do not implement, a missing field) raises `ModelError`, whose one-line
message names the file and the field — the process stops at start, before anything serves.

    arch = read_arch(Path("/models/qwen3-0.6b"))
    arch.num_kv_heads, arch.head_dim, arch.rope.kind
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gyre.errors import StartupError
from gyre.model.architectures import HF_CLASSES, Architecture, by_hf_class

CONFIG_FILE = "config.json"
ROPE_KINDS = ("default", "linear", "llama3", "yarn")
DTYPES = ("float32", "bfloat16", "float16")


class ModelError(StartupError):
    """A model directory Gyre cannot use; the message is one line naming the file and the field."""

    def __init__(self, path: Path | str, field_name: str, problem: str) -> None:
        super().__init__(f"{path}: {field_name}: {problem}")
        self.path = str(path)
        self.field = field_name


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """Rotary settings in transformers' `rope_parameters` terms (only what the kind uses is set)."""

    kind: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


@dataclass(frozen=True, slots=True)
class MoeSpec:
    """The sparse layers of a mixture-of-experts checkpoint, as transformers' Qwen3-MoE computes them:
    router logits = `mlp.gate` (no bias), probabilities = softmax in float32 over all experts, the
    `num_experts_per_tok` largest kept (renormalized to sum 1 when `norm_topk_prob`), cast back to the
    model's dtype; the output is the weighted sum of the chosen experts' SwiGLU MLPs. No shared expert."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    """Layers that keep a dense MLP of `intermediate_size` (transformers' rule, with decoder_sparse_step)."""

    def is_sparse(self, layer: int) -> bool:
        return (
            layer not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer + 1) % self.decoder_sparse_step == 0
        )


@dataclass(frozen=True, slots=True)
class ModelArch:
    """Shapes and switches of one checkpoint (what engine, trainer and KV migration must agree on)."""

    architecture: str
    """config.json's class (`Qwen3ForCausalLM`); its record is `gyre.model.architectures.by_hf_class`."""
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeSpec
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    """Bias on q/k/v projections (Qwen2; attention_bias elsewhere)."""
    o_bias: bool = False
    """Bias on the output projection (attention_bias)."""
    mlp_bias: bool = False
    qk_norm: bool = False
    """RMSNorm over each head of q and k before rotary (Qwen3)."""
    dtype: str = "float32"
    """The weights' dtype as the checkpoint declares it (`torch_dtype` / `dtype`)."""
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    moe: MoeSpec | None = None
    """The experts of a mixture-of-experts checkpoint (None: every layer has a dense MLP)."""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    """The config.json as read: publication writes it back unchanged but for the dtype."""

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def fingerprint(self) -> str:
        """A short stable id of everything that shapes KV and logits (KV moves only between equals)."""
        data = asdict(self)
        data.pop("raw")
        data.pop("dtype")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter of the checkpoint by its HF name (`lm_head.weight` only when untied)."""
        h, inter = self.hidden_size, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (self.vocab_size, h),
            "model.norm.weight": (h,),
        }
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            shapes[p + "self_attn.q_proj.weight"] = (self.q_size, h)
            shapes[p + "self_attn.k_proj.weight"] = (self.kv_size, h)
            shapes[p + "self_attn.v_proj.weight"] = (self.kv_size, h)
            shapes[p + "self_attn.o_proj.weight"] = (h, self.q_size)
            if self.qkv_bias:
                shapes[p + "self_attn.q_proj.bias"] = (self.q_size,)
                shapes[p + "self_attn.k_proj.bias"] = (self.kv_size,)
                shapes[p + "self_attn.v_proj.bias"] = (self.kv_size,)
            if self.o_bias:
                shapes[p + "self_attn.o_proj.bias"] = (h,)
            if self.qk_norm:
                shapes[p + "self_attn.q_norm.weight"] = (self.head_dim,)
                shapes[p + "self_attn.k_norm.weight"] = (self.head_dim,)
            if self.moe is not None and self.moe.is_sparse(i):
                shapes[p + "mlp.gate.weight"] = (self.moe.num_experts, h)
                for e in range(self.moe.num_experts):
                    shapes.update(
                        _mlp_shapes(f"{p}mlp.experts.{e}.", h, self.moe.moe_intermediate_size, False)
                    )
            else:
                shapes.update(_mlp_shapes(p + "mlp.", h, inter, self.mlp_bias))
        return shapes

    def num_parameters(self) -> int:
        total = 0
        for shape in self.parameter_shapes().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


def _mlp_shapes(prefix: str, hidden: int, inter: int, bias: bool) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for proj, shape in (
        ("gate_proj", (inter, hidden)),
        ("up_proj", (inter, hidden)),
        ("down_proj", (hidden, inter)),
    ):
        shapes[f"{prefix}{proj}.weight"] = shape
        if bias:
            shapes[f"{prefix}{proj}.bias"] = (shape[0],)
    return shapes


def read_arch(directory: Path) -> ModelArch:
    """Parse and check `<directory>/config.json`; `ModelError` names the field that is wrong."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ModelError(path, CONFIG_FILE, "missing: a Hugging Face model directory needs config.json")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(path, CONFIG_FILE, f"not readable JSON ({e})") from e
    if not isinstance(raw, dict):
        raise ModelError(path, CONFIG_FILE, "top level must be an object")
    return arch_from_config(raw, path)


def arch_from_config(raw: dict[str, Any], path: Path | str = CONFIG_FILE) -> ModelArch:
    """`ModelArch` of a config dict (`path` only names the source in errors)."""
    archs = raw.get("architectures")
    record = by_hf_class(archs[0]) if isinstance(archs, list) and len(archs) == 1 else None
    if record is None:
        raise ModelError(
            path, "architectures", f"{archs!r} is not supported; Gyre runs one of {', '.join(HF_CLASSES)}"
        )
    cfg = _ConfigFields({**record.config_defaults, **raw}, path)
    _refuse_unsupported(cfg)
    heads, kv_heads, head_dim = _attention_shape(cfg, record)
    dtype = str(cfg.values.get("dtype") or cfg.values.get("torch_dtype") or "float32")
    if dtype not in DTYPES:
        raise ModelError(path, "torch_dtype", f"{dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    eos = cfg.values.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    max_positions = cfg.integer("max_position_embeddings")
    switches = record.switches(cfg.flag)
    num_layers = cfg.integer("num_hidden_layers")
    return ModelArch(
        architecture=record.hf_class,
        hidden_size=cfg.integer("hidden_size"),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=cfg.integer("intermediate_size"),
        vocab_size=cfg.integer("vocab_size"),
        max_position_embeddings=max_positions,
        rms_norm_eps=cfg.positive("rms_norm_eps"),
        rope=read_rope(cfg.values, max_positions, path),
        tie_word_embeddings=cfg.flag("tie_word_embeddings"),
        qkv_bias=switches.qkv_bias,
        o_bias=switches.o_bias,
        mlp_bias=switches.mlp_bias,
        qk_norm=switches.qk_norm,
        dtype=dtype,
        eos_token_ids=tuple(int(t) for t in eos_ids),
        bos_token_id=cfg.values.get("bos_token_id"),
        moe=read_moe(cfg, num_layers) if record.experts else None,
        raw=raw,
    )


@dataclass(frozen=True, slots=True)
class _ConfigFields:
    """config.json values (the architecture's defaults under them), read with checks that name the key."""

    values: dict[str, Any]
    path: Path | str

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ModelError(self.path, key, f"must be an integer >= {minimum}; got {value!r}")
        return value

    def flag(self, key: str) -> bool:
        value = self.values.get(key, False)
        if not isinstance(value, bool):
            raise ModelError(self.path, key, f"must be true or false; got {value!r}")
        return value

    def positive(self, key: str) -> float:
        value = self.values.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ModelError(self.path, key, f"must be a number > 0; got {value!r}")
        return float(value)


def _refuse_unsupported(cfg: _ConfigFields) -> None:
    """The config switches of the decoders Gyre does not implement (each refusal names its key)."""
    values, path = cfg.values, cfg.path
    if values.get("hidden_act", "silu") != "silu":
        raise ModelError(
            path, "hidden_act", f"{values['hidden_act']!r} is not supported (SwiGLU with silu only)"
        )
    if cfg.flag("use_sliding_window"):
        raise ModelError(
            path, "use_sliding_window", "sliding-window attention is not supported; set it false"
        )
    layer_types = values.get("layer_types")
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ModelError(path, "layer_types", "only full_attention layers are supported")
    if values.get("pretraining_tp", 1) not in (1, None):
        raise ModelError(path, "pretraining_tp", f"must be 1; got {values['pretraining_tp']!r}")
    if values.get("partial_rotary_factor", 1.0) not in (1, 1.0, None):
        raise ModelError(path, "partial_rotary_factor", "partial rotary embeddings are not supported")


def _attention_shape(cfg: _ConfigFields, record: Architecture) -> tuple[int, int, int]:
    """(heads, kv heads, head dim), checked: kv heads divide heads, the head dim is even."""
    path = cfg.path
    hidden = cfg.integer("hidden_size")
    heads = cfg.integer("num_attention_heads")
    kv_heads = cfg.integer("num_key_value_heads", record.default_num_kv_heads or heads)
    if heads % kv_heads:
        raise ModelError(path, "num_key_value_heads", f"{kv_heads} must divide num_attention_heads={heads}")
    head_dim_default = hidden // heads if hidden % heads == 0 else None
    head_dim = (
        cfg.integer("head_dim", head_dim_default)
        if cfg.values.get("head_dim") is not None
        else head_dim_default
    )
    if head_dim is None:
        raise ModelError(path, "head_dim", f"needed: hidden_size={hidden} is not a multiple of {heads} heads")
    if head_dim % 2:
        raise ModelError(path, "head_dim", f"must be even for rotary embeddings; got {head_dim}")
    return heads, kv_heads, head_dim


_MOE_UNSUPPORTED = {
    "shared_expert_intermediate_size": "shared experts (Qwen2-MoE's) are not supported; Qwen3-MoE has none",
    "output_router_logits": (
        "the router's load-balancing loss is not part of Gyre's objective (transformers adds it only "
        "with output_router_logits); set it false"
    ),
}


def read_moe(cfg: _ConfigFields, num_layers: int) -> MoeSpec:
    """The experts of a Qwen3-MoE config (`num_experts`, or transformers 5's `num_local_experts`);
    `ModelError` names a field Gyre does not implement."""
    values, path = cfg.values, cfg.path
    for key, problem in _MOE_UNSUPPORTED.items():
        if values.get(key) not in (None, 0, False):
            raise ModelError(path, key, problem)
    # transformers 5 writes `num_local_experts` (its attribute map); the Hub's configs say `num_experts`.
    experts_key = (
        "num_local_experts"
        if "num_experts" not in values and "num_local_experts" in values
        else "num_experts"
    )
    num_experts = cfg.integer(experts_key, 128, minimum=0)
    top_k = cfg.integer("num_experts_per_tok")
    if num_experts and top_k > num_experts:
        raise ModelError(path, "num_experts_per_tok", f"{top_k} is more than {experts_key}={num_experts}")
    only = values.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers for i in only
    ):
        raise ModelError(
            path, "mlp_only_layers", f"must list layer indices in [0, {num_layers}); got {only!r}"
        )
    return MoeSpec(
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=cfg.integer("moe_intermediate_size"),
        norm_topk_prob=cfg.flag("norm_topk_prob"),
        decoder_sparse_step=cfg.integer("decoder_sparse_step"),
        mlp_only_layers=tuple(sorted(set(only))),
    )


def read_rope(cfg: dict[str, Any], max_positions: int, path: Path | str = CONFIG_FILE) -> RopeSpec:
    """RoPE from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (the Hub's configs)."""
    params = cfg.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params, key = cfg.get("rope_scaling"), "rope_scaling"
    params = dict(params or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ModelError(path, key, "per-layer-type rope parameters are not supported")
    kind = str(params.get("rope_type", params.get("type", "default")))
    if kind not in ROPE_KINDS:
        raise ModelError(
            path, f"{key}.rope_type", f"{kind!r} is not supported; use one of {', '.join(ROPE_KINDS)}"
        )
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if not isinstance(theta, int | float) or not theta > 0:
        raise ModelError(path, "rope_theta", f"must be a number > 0; got {theta!r}")

    def number(name: str, required: bool = False) -> float | None:
        value = params.get(name)
        if value is None:
            if required:
                raise ModelError(path, f"{key}.{name}", f"required for rope_type {kind!r}")
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ModelError(path, f"{key}.{name}", f"must be a number; got {value!r}")
        return float(value)

    if kind == "default":
        return RopeSpec(theta=float(theta))
    original = params.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    if kind == "linear":
        return RopeSpec(kind=kind, theta=float(theta), factor=float(number("factor", True) or 1.0))
    if kind == "llama3":
        return RopeSpec(
            kind=kind,
            theta=float(theta),
            factor=float(number("factor", True) or 1.0),
            low_freq_factor=number("low_freq_factor", True),
            high_freq_factor=number("high_freq_factor", True),
            original_max_position_embeddings=int(original or max_positions),
        )
    return RopeSpec(
        kind=kind,
        theta=float(theta),
        factor=float(number("factor", True) or 1.0),
        original_max_position_embeddings=int(original or max_positions),
        beta_fast=number("beta_fast"),
        beta_slow=number("beta_slow"),
        attention_factor=number("attention_factor"),
        mscale=number("mscale"),
        mscale_all_dim=number("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
    )
