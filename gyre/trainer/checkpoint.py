"""Trainer checkpoints and published weights, as Hugging Face model directories.

Layout under the checkpoint root (`cell_agent.trainer.checkpoint_dir`, default `<run dir>/checkpoints`):

    step-00000012/            an HF directory (config.json, model.safetensors, tokenizer files) ...
    step-00000012/optimizer.pt      ... plus the optimizer state (torch.save; loaded with weights_only=True)
    step-00000012/trainer.json      ... and {"policy_version": 12, "backend": "torch"}, written last
    published/v00000012/      the weights of a publication: an HF directory engines load on a switch to
                              rollout, `AutoModelForCausalLM.from_pretrained` loads and SGLang serves
                              (`--model-path`, `/update_weights_from_disk`)

A run that trains a LoRA adapter (`cell_agent.trainer.lora`) writes PEFT adapter directories
instead (adapter_config.json + adapter_model.safetensors, `gyre.model.lora`): a checkpoint is the
adapter, its optimizer state and trainer.json (`"lora": true`), a publication is the adapter that
`peft.PeftModel.from_pretrained` and SGLang's `/load_lora_adapter` load on top of `model.path`.

The policy version rides in the safetensors metadata (`gyre_policy_version`), which transformers,
peft and SGLang ignore. Directories are written under a temporary name and renamed into place, so a reader
never sees half of one; a checkpoint directory counts only once `trainer.json` is in it.

    path = save_trainer_checkpoint(root, version=12, arch=arch, tensors=named, optimizer=opt, backend="torch",
                                   source=model_dir)
    latest = latest_checkpoint(root)
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from gyre.model.arch import ModelArch
from gyre.model.files import POLICY_VERSION_KEY, check_model_dir
from gyre.model.lora import LoraAdapter, read_adapter_dir, write_adapter_dir
from gyre.model.weights import load_state_dict, write_model_dir

OPTIMIZER_FILENAME = "optimizer.pt"
TRAINER_FILENAME = "trainer.json"
PUBLISHED_DIR = "published"
_STEP_DIR = re.compile(r"^step-(\d{8})$")
_PUBLISHED = re.compile(r"^v(\d{8})$")


def write_weights(
    out: Path,
    *,
    arch: ModelArch,
    tensors: Mapping[str, torch.Tensor],
    version: int,
    source: Path,
    adapter: LoraAdapter | None = None,
) -> Path:
    """An HF directory of `tensors` (copied to the host) tagged with the policy version, atomically; with
    `adapter`, a PEFT adapter directory of it instead (`tensors` are then its matrices)."""
    metadata = {POLICY_VERSION_KEY: str(version)}
    if adapter is not None:
        return write_adapter_dir(out, adapter, base_model=source, metadata=metadata)
    return write_model_dir(out, arch=arch, tensors=tensors, source=source, metadata=metadata)


def step_dir(root: Path, version: int) -> Path:
    return Path(root) / f"step-{version:08d}"


def staged_dir(root: Path, version: int) -> Path:
    """Where `save_trainer_checkpoint` assembles `step_dir(root, version)` before renaming it into place
    (the same name in every process: the TP ranks of a megatron cell write their shards into it)."""
    final = step_dir(root, version)
    return final.with_name(f"{final.name}.staged")


def save_trainer_checkpoint(
    root: Path,
    *,
    version: int,
    arch: ModelArch,
    tensors: Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | None,
    backend: str,
    source: Path,
    keep: int = 2,
    write_extra: Callable[[Path], None] | None = None,
    info: Mapping[str, Any] | None = None,
    adapter: LoraAdapter | None = None,
) -> Path:
    """Write `step-<version>/` (replacing an older copy of the same version) and prune to `keep`.
    `write_extra(staged)` adds a backend's own files (e.g. per-rank optimizer shards) before
    `trainer.json`, which also records `info`, marks the directory complete. With `adapter` the
    checkpoint is that LoRA adapter (PEFT directory), not the weights."""
    final = step_dir(root, version)
    staged = write_weights(
        staged_dir(root, version), arch=arch, tensors=tensors, version=version, source=source, adapter=adapter
    )
    if adapter is not None:
        info = {**(info or {}), "lora": True}
    if optimizer is not None:
        torch.save(optimizer.state_dict(), staged / OPTIMIZER_FILENAME)
    if write_extra is not None:
        write_extra(staged)
    (staged / TRAINER_FILENAME).write_text(
        json.dumps({**(info or {}), "policy_version": version, "backend": backend})
    )
    if final.exists():
        shutil.rmtree(final)
    staged.replace(final)
    prune_checkpoints(root, keep)
    return final


def _complete(root: Path) -> list[tuple[int, Path]]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / TRAINER_FILENAME).is_file()
    )


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint with the highest version under `root`, if any."""
    found = _complete(root)
    return found[-1][1] if found else None


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the `keep` newest complete checkpoints."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1; got {keep}")
    for _, path in _complete(root)[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


def read_trainer_info(path: Path) -> dict[str, Any]:
    """`trainer.json` of a complete checkpoint directory (policy_version, backend, backend extras)."""
    info_path = Path(path) / TRAINER_FILENAME
    if not info_path.is_file():
        raise ValueError(f"{path} is not a complete trainer checkpoint (no {TRAINER_FILENAME})")
    info: dict[str, Any] = json.loads(info_path.read_text())
    return info


def read_trainer_checkpoint(
    path: Path, dtype: torch.dtype = torch.float32
) -> tuple[ModelArch, dict[str, torch.Tensor], dict[str, Any] | None, int]:
    """(architecture, weights, optimizer state or None, policy version) of a checkpoint directory."""
    path = Path(path)
    trainer_info = read_trainer_info(path)
    if trainer_info.get("lora"):
        raise ValueError(
            f"{path} is a LoRA adapter checkpoint; a run without cell_agent.trainer.lora cannot resume from it"
        )
    version = int(trainer_info["policy_version"])
    info = check_model_dir(path)
    return info.arch, load_state_dict(info, dtype), _optimizer_state(path), version


def read_adapter_checkpoint(
    path: Path, arch: ModelArch, dtype: torch.dtype = torch.float32
) -> tuple[LoraAdapter, dict[str, Any] | None, int]:
    """(adapter, optimizer state or None, policy version) of a LoRA checkpoint directory for `arch`."""
    path = Path(path)
    trainer_info = read_trainer_info(path)
    if not trainer_info.get("lora"):
        raise ValueError(
            f"{path} is a full-weights checkpoint; a run with cell_agent.trainer.lora cannot resume from it"
        )
    adapter = read_adapter_dir(path, arch, dtype)
    return adapter, _optimizer_state(path), int(trainer_info["policy_version"])


def _optimizer_state(path: Path) -> dict[str, Any] | None:
    optimizer_path = path / OPTIMIZER_FILENAME
    return torch.load(optimizer_path, weights_only=True) if optimizer_path.is_file() else None


def published_path(root: Path, version: int) -> Path:
    return Path(root) / PUBLISHED_DIR / f"v{version:08d}"


def write_published(
    root: Path,
    *,
    version: int,
    arch: ModelArch,
    tensors: Mapping[str, torch.Tensor],
    source: Path,
    keep: int = 2,
    adapter: LoraAdapter | None = None,
) -> Path:
    """Write publication `version` as an HF directory (a PEFT adapter directory with `adapter`) and
    delete all but the `keep` newest ones."""
    path = write_weights(
        published_path(root, version),
        arch=arch,
        tensors=tensors,
        version=version,
        source=source,
        adapter=adapter,
    )
    older = sorted((int(m.group(1)), p) for p in path.parent.iterdir() if (m := _PUBLISHED.match(p.name)))
    for _, p in older[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
    return path
