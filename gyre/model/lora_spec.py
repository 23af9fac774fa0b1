"""LoRA settings and targets, without torch: what a config check needs before anything starts.

    spec = LoraSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"))
    targets = resolve_targets(arch, spec.target_modules, "cell_agent.trainer.lora.target_modules")
    config = adapter_config(spec, targets, base_model="/models/qwen3")    # adapter_config.json (PEFT)
    spec = spec_from_config(json.loads(text), source=path)

Targets are the attention projections and the MLPs of dense layers:

    q_proj k_proj v_proj o_proj        model.layers.{i}.self_attn.<name>
    gate_proj up_proj down_proj        model.layers.{i}.mlp.<name>       (not the experts of a sparse layer)

A target name matches a module whose path is the name or ends with "." + name (PEFT's rule for a
list); `all-linear` means all seven. The adapters themselves (torch) are `gyre.model.lora`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.model.arch import ModelArch, ModelError

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION_TARGETS + MLP_TARGETS
ALL_LINEAR = "all-linear"
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


class AdapterError(ModelError):
    """An adapter directory or LoRA setting Gyre cannot use; one line naming the file and the field."""


@dataclass(frozen=True, slots=True)
class LoraSpec:
    rank: int
    alpha: float
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    use_rslora: bool = False

    @property
    def scaling(self) -> float:
        return self.alpha / math.sqrt(self.rank) if self.use_rslora else self.alpha / self.rank


@dataclass(frozen=True, slots=True)
class Target:
    layer: int
    module: str
    in_features: int
    out_features: int

    @property
    def path(self) -> str:
        owner = "self_attn" if self.module in ATTENTION_TARGETS else "mlp"
        return f"model.layers.{self.layer}.{owner}.{self.module}"


def linear_modules(arch: ModelArch) -> list[Target]:
    """Every linear module of `arch` a LoRA adapter may target, in layer order."""
    d, q, kv, inter = arch.hidden_size, arch.q_size, arch.kv_size, arch.intermediate_size
    shapes = {
        "q_proj": (d, q),
        "k_proj": (d, kv),
        "v_proj": (d, kv),
        "o_proj": (q, d),
        "gate_proj": (d, inter),
        "up_proj": (d, inter),
        "down_proj": (inter, d),
    }
    out: list[Target] = []
    for layer in range(arch.num_layers):
        dense = arch.moe is None or not arch.moe.is_sparse(layer)
        for name in TARGETS if dense else ATTENTION_TARGETS:
            out.append(Target(layer, name, *shapes[name]))
    return out


def resolve_targets(
    arch: ModelArch, target_modules: Sequence[str], field: str = "target_modules"
) -> list[Target]:
    """The modules `target_modules` select (PEFT's suffix rule; `all-linear` = every one). Raises
    `AdapterError` naming a target that matches no module, so nothing starts with an adapter that
    would silently adapt less than asked."""
    if not target_modules:
        raise AdapterError("config", field, "is empty; name at least one module (e.g. q_proj, v_proj)")
    candidates = linear_modules(arch)
    if ALL_LINEAR in target_modules:
        return candidates
    chosen: set[tuple[int, str]] = set()
    for target in target_modules:
        hits = [t for t in candidates if t.path == target or t.path.endswith("." + target)]
        if not hits:
            names = ", ".join(sorted({t.module for t in candidates}))
            raise AdapterError(
                "config",
                field,
                f"{target!r} matches no module of {arch.architecture} LoRA can adapt ({names}, or {ALL_LINEAR})",
            )
        chosen.update((t.layer, t.module) for t in hits)
    return [t for t in candidates if (t.layer, t.module) in chosen]


def peft_key(target: Target, matrix: str) -> str:
    """The tensor name PEFT saves for `matrix` ("A" or "B") of `target`."""
    return f"{PEFT_PREFIX}{target.path}.lora_{matrix}.weight"


def adapter_config(spec: LoraSpec, targets: Sequence[Target], base_model: str | None) -> dict[str, Any]:
    """adapter_config.json as PEFT writes it (the keys its LoraConfig reads; the rest take defaults)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "use_rslora": spec.use_rslora,
        "target_modules": sorted({t.module for t in targets}),
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "use_dora": False,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def spec_from_config(config: Mapping[str, Any], source: Path | str = CONFIG_FILE) -> LoraSpec:
    """`LoraSpec` of a PEFT adapter_config.json (refusing what Gyre does not compute: DoRA, biases,
    per-module ranks, fan_in_fan_out, modules_to_save)."""
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(source, "peft_type", f"{config.get('peft_type')!r} is not LORA")
    for key, allowed in (
        ("use_dora", (None, False)),
        ("fan_in_fan_out", (None, False)),
        ("bias", (None, "none")),
        ("lora_bias", (None, False)),
        ("modules_to_save", (None, [])),
        ("rank_pattern", (None, {})),
        ("alpha_pattern", (None, {})),
        ("layers_to_transform", (None,)),
    ):
        if config.get(key) not in allowed:
            raise AdapterError(source, key, f"{config[key]!r} is not supported (Gyre serves plain LoRA)")
    rank, alpha = config.get("r"), config.get("lora_alpha", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterError(source, "r", f"must be an integer >= 1; got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise AdapterError(source, "lora_alpha", f"must be a number > 0; got {alpha!r}")
    targets = config.get("target_modules")
    names = (targets,) if isinstance(targets, str) else tuple(targets or ())
    return LoraSpec(
        rank=rank,
        alpha=float(alpha),
        dropout=float(config.get("lora_dropout") or 0.0),
        target_modules=names,
        use_rslora=bool(config.get("use_rslora", False)),
    )
