"""LoRA adapters on `CausalLM`'s linear modules, read and written in PEFT's format.

A LoRA adapter adds `B·A·x · scaling` (A: [r, in], B: [out, r], scaling = alpha / r, or alpha / √r
with rsLoRA) to the output of each targeted linear module, exactly as `peft`'s `lora.Linear` does
(`lora_B(lora_A(dropout(x))) * scaling`). The base parameters are never touched: the trainer trains A
and B only, engines serve base + adapter, and a publication is the adapter (megabytes) instead of the
whole model. Targets are the attention projections and the MLPs of dense layers:

    q_proj k_proj v_proj o_proj        model.layers.{i}.self_attn.<name>
    gate_proj up_proj down_proj        model.layers.{i}.mlp.<name>       (not the experts of a sparse layer)

A target name matches a module whose path is the name or ends with "." + name (PEFT's rule for a
list), `all-linear` means all seven. The adapter's tensors are named as PEFT saves them:
`base_model.model.<module path>.lora_A.weight` / `.lora_B.weight`, next to an `adapter_config.json`,
so `peft.PeftModel.from_pretrained(transformers_model, DIR)` loads a directory Gyre wrote and Gyre
reads one PEFT wrote.

    spec = LoraSpec(rank=8, alpha=16, dropout=0.0, target_modules=("q_proj", "v_proj"))
    adapter = LoraAdapter(arch, spec).init_weights(seed=0)      # A as PEFT draws it, B = 0
    logits = model(ids, positions, cu_seqlens, lora=adapter)     # training: one adapter
    write_adapter_dir(out, adapter, base_model=model_dir)        # adapter_config.json + adapter_model.safetensors
    adapter = read_adapter_dir(out, arch)                        # AdapterError names the file and field
    bank = LoraBank(arch); bank.load("v3", adapter); rows = bank.rows(["v3", None, "v3"])   # serving
    logits = model.forward_paged(ids, cache, batch, lora=rows)

This module imports torch but nothing of the engine or trainer; `LoraSpec` and `resolve_targets` are
what config checks use before anything starts.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

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


class LoraDelta(Protocol):
    """What `CausalLM`'s forwards call on each targeted module: `y + delta(x)` (or `y` untouched)."""

    def add(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...


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


class LoraAdapter(nn.Module):
    """One adapter's A and B matrices for every target, as parameters (`named_lora()` gives them
    their PEFT names). Call `add` from the model's forwards (it is a `LoraDelta`)."""

    def __init__(self, arch: ModelArch, spec: LoraSpec, targets: Sequence[Target] | None = None) -> None:
        super().__init__()
        if spec.rank < 1:
            raise AdapterError("config", "rank", f"must be at least 1; got {spec.rank}")
        self.arch = arch
        self.spec = spec
        self.scaling = spec.scaling
        self.targets = list(targets) if targets is not None else resolve_targets(arch, spec.target_modules)
        self.lora_A = nn.ParameterList(torch.zeros(spec.rank, t.in_features) for t in self.targets)
        self.lora_B = nn.ParameterList(torch.zeros(t.out_features, spec.rank) for t in self.targets)
        self._index = {(t.layer, t.module): i for i, t in enumerate(self.targets)}
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout > 0 else nn.Identity()

    @torch.no_grad()
    def init_weights(self, seed: int) -> LoraAdapter:
        """PEFT's default init: A ~ kaiming_uniform(a=√5) (nn.Linear's), B = 0, so base + adapter = base."""
        gen = torch.Generator().manual_seed(seed)
        for a, b in zip(self.lora_A, self.lora_B, strict=True):
            bound = 1.0 / math.sqrt(a.shape[1])  # kaiming_uniform with a=√5 on fan_in
            a.copy_(torch.rand(a.shape, generator=gen, dtype=torch.float32) * 2 * bound - bound)
            b.zero_()
        return self

    def add(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        i = self._index.get((layer, module))
        if i is None:
            return y
        delta = F.linear(F.linear(self.dropout(x), self.lora_A[i]), self.lora_B[i])
        return y + delta * self.scaling

    def named_lora(self) -> list[tuple[str, nn.Parameter]]:
        """(PEFT name, parameter) of every matrix: per target, A then B."""
        out: list[tuple[str, nn.Parameter]] = []
        for t, a, b in zip(self.targets, self.lora_A, self.lora_B, strict=True):
            out += [(peft_key(t, "A"), a), (peft_key(t, "B"), b)]
        return out

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in self.named_lora()}

    @torch.no_grad()
    def load_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy PEFT-named tensors in (strict: every matrix, right shapes)."""
        own = dict(self.named_lora())
        missing, unexpected = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
        if missing or unexpected:
            raise ValueError(
                f"adapter tensors do not match: missing {missing[:2]}, unexpected {unexpected[:2]}"
            )
        for name, param in own.items():
            if tuple(tensors[name].shape) != tuple(param.shape):
                raise ValueError(
                    f"{name} has shape {tuple(tensors[name].shape)}, expected {tuple(param.shape)}"
                )
            param.copy_(tensors[name])

    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


# -- PEFT directories -----------------------------------------------------------------------------------


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


def write_adapter_dir(
    out: Path,
    adapter: LoraAdapter,
    *,
    base_model: Path | str | None = None,
    metadata: Mapping[str, str] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write `out` atomically (a temporary sibling renamed into place): adapter_config.json and
    adapter_model.safetensors (PEFT names; `metadata` rides in the safetensors header)."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {
        n: t.detach().to("cpu", dtype=dtype or t.dtype).contiguous().clone()
        for n, t in adapter.tensors().items()
    }
    save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", **(metadata or {})})
    config = adapter_config(
        adapter.spec, adapter.targets, str(base_model) if base_model is not None else None
    )
    (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for item in tmp.iterdir():
        item.chmod(0o644)
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return out


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


def read_adapter_dir(directory: Path, arch: ModelArch, dtype: torch.dtype = torch.float32) -> LoraAdapter:
    """A PEFT LoRA directory as a `LoraAdapter` for `arch`; its targets are the modules its tensors
    name. `AdapterError` names the file and the field that is wrong."""
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not config_path.is_file():
        raise AdapterError(
            config_path, CONFIG_FILE, "missing: a PEFT adapter directory needs adapter_config.json"
        )
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        raise AdapterError(config_path, CONFIG_FILE, f"not readable JSON ({e})") from e
    if not isinstance(config, dict):
        raise AdapterError(config_path, CONFIG_FILE, "top level must be an object")
    spec = spec_from_config(config, config_path)
    if not weights_path.is_file():
        raise AdapterError(weights_path, WEIGHTS_FILE, "missing (Gyre reads safetensors adapters only)")
    try:
        with safe_open(str(weights_path), framework="pt") as f:
            tensors = {k: f.get_tensor(k).to(dtype) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise AdapterError(weights_path, WEIGHTS_FILE, f"unreadable ({e})") from e
    return adapter_from_tensors(arch, spec, tensors, weights_path)


def adapter_from_tensors(
    arch: ModelArch, spec: LoraSpec, tensors: Mapping[str, torch.Tensor], source: Path | str = WEIGHTS_FILE
) -> LoraAdapter:
    """A `LoraAdapter` holding PEFT-named `tensors` (adapter names such as `.default` are dropped)."""
    by_path = {t.path: t for t in linear_modules(arch)}
    found: dict[str, Target] = {}
    named: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        plain = key.replace(".default.weight", ".weight")
        if not plain.startswith(PEFT_PREFIX) or not plain.endswith((".lora_A.weight", ".lora_B.weight")):
            raise AdapterError(
                source, key, "is not a LoRA matrix (base_model.model.<module>.lora_A/B.weight)"
            )
        path = plain[len(PEFT_PREFIX) : -len(".lora_A.weight")]
        target = by_path.get(path)
        if target is None:
            raise AdapterError(source, key, f"names no module of {arch.architecture} LoRA can adapt")
        found[path] = target
        named[plain] = tensor
    if not found:
        raise AdapterError(source, WEIGHTS_FILE, "holds no LoRA matrices")
    targets = [t for t in linear_modules(arch) if t.path in found]
    adapter = LoraAdapter(arch, spec, targets)
    try:
        adapter.load_tensors(named)
    except ValueError as e:
        raise AdapterError(source, "tensors", str(e)) from e
    return adapter


# -- serving: one adapter per row ---------------------------------------------------------------------


class LoraRows:
    """The adapters of one serving batch: row b uses slot `slots[b]` of the bank (0 = no adapter)."""

    def __init__(self, bank: LoraBank, slots: list[int]) -> None:
        self.bank = bank
        self.slots = slots
        self.single = slots[0] if len(set(slots)) == 1 else None
        self.index = torch.tensor(slots, dtype=torch.long) if self.single is None else None

    def add(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        stacked = self.bank.stacked.get((layer, module))
        if stacked is None:
            return y
        a, b, scaling = stacked
        if self.single is not None:
            s = self.single
            return y + F.linear(F.linear(x, a[s]), b[s]) * scaling[s]
        assert self.index is not None
        rows_a, rows_b = a[self.index], b[self.index]  # [B, r, in], [B, out, r]
        flat = x.reshape(x.shape[0], -1, x.shape[-1])  # [B, Lq, in]
        delta = torch.bmm(torch.bmm(flat, rows_a.transpose(1, 2)), rows_b.transpose(1, 2))
        return y + (delta * scaling[self.index].view(-1, 1, 1)).reshape(y.shape)


class LoraBank:
    """The adapters an engine holds, stacked per target module so a batch mixing adapters (and rows
    with none) runs one forward: slot 0 is all zeros, each loaded adapter has a slot, ranks are
    padded with zeros to the largest (zero rows and columns add exact zeros)."""

    def __init__(self, arch: ModelArch, dtype: torch.dtype = torch.float32) -> None:
        self.arch = arch
        self.dtype = dtype
        self.adapters: dict[str, LoraAdapter] = {}
        self.slot: dict[str, int] = {}
        self.stacked: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.adapters

    def __len__(self) -> int:
        return len(self.adapters)

    def load(self, key: str, adapter: LoraAdapter) -> None:
        self.adapters[key] = adapter
        self._restack()

    def unload(self, key: str) -> None:
        self.adapters.pop(key, None)
        self._restack()

    @property
    def max_rank(self) -> int:
        return max((a.spec.rank for a in self.adapters.values()), default=0)

    @torch.no_grad()
    def _restack(self) -> None:
        self.slot = {key: i + 1 for i, key in enumerate(self.adapters)}
        self.stacked = {}
        rank = self.max_rank
        if not self.adapters:
            return
        num_slots = len(self.adapters) + 1
        for target in linear_modules(self.arch):
            users = [
                (self.slot[k], a, a._index[(target.layer, target.module)])
                for k, a in self.adapters.items()
                if (target.layer, target.module) in a._index
            ]
            if not users:
                continue
            a_stack = torch.zeros(num_slots, rank, target.in_features, dtype=self.dtype)
            b_stack = torch.zeros(num_slots, target.out_features, rank, dtype=self.dtype)
            scaling = torch.zeros(num_slots, dtype=self.dtype)
            for slot, adapter, i in users:
                r = adapter.spec.rank
                a_stack[slot, :r] = adapter.lora_A[i].detach().to(self.dtype)
                b_stack[slot, :, :r] = adapter.lora_B[i].detach().to(self.dtype)
                scaling[slot] = adapter.scaling
            self.stacked[(target.layer, target.module)] = (a_stack, b_stack, scaling)

    def rows(self, keys: Iterable[str | None]) -> LoraRows | None:
        """Per-row adapters of a batch (None: no row uses one)."""
        slots = [0 if k is None else self.slot[k] for k in keys]
        return LoraRows(self, slots) if any(slots) else None
