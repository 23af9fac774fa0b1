"""Save and load GyreLM as one safetensors file whose metadata carries the architecture.

    save_checkpoint(model, Path("runs/x/model.safetensors"), {"policy_version": "12"})
    model, metadata = load_checkpoint(Path("runs/x/model.safetensors"))

Metadata values are strings (a safetensors rule); the architecture is stored under
`gyre_model_config` as JSON. The engine's `/update_weights_from_disk` reads the same files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gyre.model.config import ModelConfig
from gyre.model.transformer import GyreLM

CONFIG_KEY = "gyre_model_config"
DEFAULT_FILENAME = "model.safetensors"


def resolve_checkpoint_path(path: Path) -> Path:
    """A file path as given, or `<dir>/model.safetensors` for a directory."""
    path = Path(path)
    return path / DEFAULT_FILENAME if path.is_dir() else path


def save_checkpoint(model: GyreLM, path: Path, metadata: Mapping[str, str] | None = None) -> Path:
    """Write all parameters (contiguous, CPU) plus metadata; returns the file written."""
    extra = dict(metadata or {})
    if CONFIG_KEY in extra:
        raise ValueError(f"metadata key {CONFIG_KEY!r} is reserved for the model config")
    for key, value in extra.items():
        if not isinstance(value, str):
            raise ValueError(f"checkpoint metadata values must be strings; {key!r} is {type(value).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to("cpu").contiguous() for name, p in model.named_parameters()}
    save_file(tensors, str(path), metadata={CONFIG_KEY: model.config.to_json(), **extra})
    return path


def read_checkpoint(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, str]]:
    """The config, the tensors and the user metadata of a checkpoint, without building a model."""
    path = resolve_checkpoint_path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint {path} does not exist")
    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata() or {})
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is not a Mapping)
    if CONFIG_KEY not in metadata:
        raise ValueError(f"{path} has no {CONFIG_KEY!r} metadata; it was not written by save_checkpoint")
    config = ModelConfig.from_json(metadata.pop(CONFIG_KEY))
    return config, tensors, metadata


def load_checkpoint(path: Path) -> tuple[GyreLM, dict[str, str]]:
    """Build the model the checkpoint describes and load its weights (strict); eval mode."""
    config, tensors, metadata = read_checkpoint(path)
    model = GyreLM(config)
    model.load_state_dict(tensors, strict=True)
    return model.eval(), metadata
