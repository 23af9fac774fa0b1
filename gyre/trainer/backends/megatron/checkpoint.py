"""Checkpoints of the megatron backend: an HF model directory plus per-rank optimizer shards.

Layout (one directory per policy version, under the trainer's checkpoint root):

    step-00000012/config.json               the HF config the run started from
    step-00000012/model.safetensors         full HF-named weights (gathered over the TP group)
    step-00000012/optimizer-tp0-of-2.pt     AdamW state of TP rank 0's shard (torch.save)
    step-00000012/optimizer-tp1-of-2.pt
    step-00000012/trainer.json              {"policy_version": 12, "backend": "megatron", "tensor_parallel_size": 2}

The weights are an ordinary HF checkpoint directory (an engine or `transformers` loads them), so a
checkpoint restores under any TP size; optimizer shards only under the TP size that wrote them. Files
are written into a temporary directory that rank 0 renames into place after every rank has written
its shard; `trainer.json` is written last and marks the directory complete.

    config, tensors = read_hf_directory(Path("model"))
    write_hf_directory(Path("out"), config, tensors)
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
from safetensors.torch import load_file, save_file

CONFIG_FILENAME = "config.json"
WEIGHTS_FILENAME = "model.safetensors"
TRAINER_FILENAME = "trainer.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def read_hf_directory(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, every tensor of the directory's *.safetensors files)."""
    path = Path(path)
    config_path = path / CONFIG_FILENAME
    if not config_path.is_file():
        raise ValueError(f"{path} is not an HF model directory (no {CONFIG_FILENAME})")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            if name in tensors:
                raise ValueError(f"{path}: tensor {name!r} appears in more than one safetensors file")
            tensors[name] = t
    return json.loads(config_path.read_text()), tensors


def write_hf_directory(path: Path, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> Path:
    """config.json + model.safetensors (host copies, contiguous) into `path`."""
    path.mkdir(parents=True, exist_ok=True)
    host = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    save_file(host, str(path / WEIGHTS_FILENAME), metadata={"format": "pt"})
    (path / CONFIG_FILENAME).write_text(json.dumps(dict(config), indent=2, sort_keys=True))
    return path


def step_dir(root: Path, version: int) -> Path:
    return Path(root) / f"step-{version:08d}"


def staging_dir(root: Path, version: int) -> Path:
    """Where every rank writes before rank 0 renames it to `step_dir` (same name on every rank)."""
    return Path(root) / f".step-{version:08d}.partial"


def optimizer_filename(tp_rank: int, tp_size: int) -> str:
    return f"optimizer-tp{tp_rank}-of-{tp_size}.pt"


def finish_checkpoint(root: Path, version: int, *, tp_size: int, keep: int) -> Path:
    """Rank 0, after every rank has written into `staging_dir`: mark complete, rename, prune."""
    staging, final = staging_dir(root, version), step_dir(root, version)
    info = {"policy_version": version, "backend": "megatron", "tensor_parallel_size": tp_size}
    (staging / TRAINER_FILENAME).write_text(json.dumps(info))
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    complete = sorted(
        (int(m.group(1)), p)
        for p in Path(root).iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / TRAINER_FILENAME).is_file()
    )
    for _, old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_checkpoint_info(path: Path) -> dict[str, Any]:
    info_path = Path(path) / TRAINER_FILENAME
    if not info_path.is_file():
        raise ValueError(f"{path} is not a complete megatron checkpoint (no {TRAINER_FILENAME})")
    info: dict[str, Any] = json.loads(info_path.read_text())
    if info.get("backend") != "megatron":
        raise ValueError(f"{path} was written by the {info.get('backend')!r} backend, not megatron")
    return info
