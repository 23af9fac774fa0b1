"""Trainer checkpoints (model + optimizer + policy version) and published weight files, on disk.

Layout under the checkpoint root (`cell_agent.trainer.checkpoint_dir`, default `<run dir>/checkpoints`):

    step-00000012/model.safetensors    weights; metadata: architecture and `policy_version`
    step-00000012/optimizer.pt         optimizer state (torch.save; loaded with weights_only=True)
    step-00000012/trainer.json         {"policy_version": 12, "backend": "torch"}
    published/v00000012.safetensors    the weights of a publication, read by engines on a switch to rollout

Every file is written under a temporary name and renamed into place, so a reader never sees half a
checkpoint; `trainer.json` is written last and marks the directory complete. The model file has the
format of `gyre.model.checkpoint`, so an engine's `/update_weights_from_disk` reads it directly.

    path = save_trainer_checkpoint(root, version=12, model=model, optimizer=opt)
    latest = latest_checkpoint(root)
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from gyre.model.checkpoint import CONFIG_KEY, DEFAULT_FILENAME, read_checkpoint
from gyre.model.config import ModelConfig

OPTIMIZER_FILENAME = "optimizer.pt"
TRAINER_FILENAME = "trainer.json"
PUBLISHED_DIR = "published"
_STEP_DIR = re.compile(r"^step-(\d{8})$")
_PUBLISHED = re.compile(r"^v(\d{8})\.safetensors$")


def write_weights(
    path: Path, config: ModelConfig, tensors: Mapping[str, torch.Tensor], version: int
) -> Path:
    """Write named weights (copied to the host) in the `gyre.model.checkpoint` format, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    host = {name: t.detach().to("cpu").clone().contiguous() for name, t in tensors.items()}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(host, str(tmp), metadata={CONFIG_KEY: config.to_json(), "policy_version": str(version)})
    tmp.replace(path)
    return path


def step_dir(root: Path, version: int) -> Path:
    return Path(root) / f"step-{version:08d}"


def save_trainer_checkpoint(
    root: Path,
    *,
    version: int,
    config: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | None,
    backend: str,
    keep: int = 2,
) -> Path:
    """Write `step-<version>/` (replacing an older copy of the same version) and prune to `keep`."""
    final = step_dir(root, version)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_weights(tmp / DEFAULT_FILENAME, config, tensors, version)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILENAME)
    (tmp / TRAINER_FILENAME).write_text(json.dumps({"policy_version": version, "backend": backend}))
    if final.exists():
        shutil.rmtree(final)
    tmp.replace(final)
    prune_checkpoints(root, keep)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint with the highest version under `root`, if any."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / TRAINER_FILENAME).is_file()
    ]
    return max(found)[1] if found else None


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the `keep` newest complete checkpoints."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1; got {keep}")
    complete = sorted(
        (int(m.group(1)), p)
        for p in Path(root).iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / TRAINER_FILENAME).is_file()
    )
    for _, path in complete[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


def read_trainer_checkpoint(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any] | None, int]:
    """(architecture, weights, optimizer state or None, policy version) of a checkpoint directory."""
    path = Path(path)
    info_path = path / TRAINER_FILENAME
    if not info_path.is_file():
        raise ValueError(f"{path} is not a complete trainer checkpoint (no {TRAINER_FILENAME})")
    version = int(json.loads(info_path.read_text())["policy_version"])
    config, tensors, _ = read_checkpoint(path / DEFAULT_FILENAME)
    optimizer_path = path / OPTIMIZER_FILENAME
    optimizer = torch.load(optimizer_path, weights_only=True) if optimizer_path.is_file() else None
    return config, tensors, optimizer, version


def published_path(root: Path, version: int) -> Path:
    return Path(root) / PUBLISHED_DIR / f"v{version:08d}.safetensors"


def write_published(
    root: Path, *, version: int, config: ModelConfig, tensors: Mapping[str, torch.Tensor], keep: int = 2
) -> Path:
    """Write the weights of publication `version` and delete all but the `keep` newest publications."""
    path = write_weights(published_path(root, version), config, tensors, version)
    older = sorted(
        (int(m.group(1)), p) for p in path.parent.iterdir() if (m := _PUBLISHED.match(p.name))
    )
    for _, p in older[:-keep]:
        p.unlink(missing_ok=True)
    return path
