"""LoRA adapters on `CausalLM`'s linear modules, read and written in PEFT's format.

A LoRA adapter adds `B·A·x · scaling` (A: [r, in], B: [out, r], scaling = alpha / r, or alpha / √r
with rsLoRA) to the output of each targeted linear module, exactly as `peft`'s `lora.Linear` does
(`lora_B(lora_A(dropout(x))) * scaling`). The base parameters are never touched: the trainer trains A
and B only, engines serve base + adapter, and a publication is the adapter (megabytes) instead of the
whole model. Which modules an adapter targets, and its settings, are `gyre.model.lora_spec` (no
torch). The adapter's tensors are named as PEFT saves them:
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
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from gyre.durable import replacing_dir
from gyre.model.arch import ModelArch
from gyre.model.lora_spec import (
    CONFIG_FILE,
    PEFT_PREFIX,
    WEIGHTS_FILE,
    AdapterError,
    LoraSpec,
    Target,
    adapter_config,
    linear_modules,
    peft_key,
    resolve_targets,
    spec_from_config,
)


class LoraDelta(Protocol):
    """What `CausalLM`'s forwards call on each targeted module: `y + delta(x)` (or `y` untouched)."""

    def add(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...


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


def frozen_adapter(adapter: LoraAdapter | None, tensors: Mapping[str, torch.Tensor]) -> LoraAdapter | None:
    """A copy of `adapter` holding `tensors` (its matrices at one version, e.g. a publication's) that
    training no longer changes; None when there is no adapter."""
    if adapter is None:
        return None
    frozen = LoraAdapter(adapter.arch, adapter.spec, adapter.targets).to(next(iter(tensors.values())).dtype)
    frozen.load_tensors(tensors)
    return frozen.eval()


# -- PEFT directories -----------------------------------------------------------------------------------


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
    with replacing_dir(out) as tmp:
        tensors = {
            n: t.detach().to("cpu", dtype=dtype or t.dtype).contiguous().clone()
            for n, t in adapter.tensors().items()
        }
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", **(metadata or {})})
        config = adapter_config(
            adapter.spec, adapter.targets, str(base_model) if base_model is not None else None
        )
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return Path(out)


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
