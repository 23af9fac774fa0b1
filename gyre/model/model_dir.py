"""The run's model directory, read once: where `model.path` points, resolved and checked, as one object a
service builds at its start and hands to the components that need it (its path, its architecture).

Every process that serves, trains or renders with the model reads `model.path` here and nowhere else, so a
directory that is not set, missing, truncated or disagreeing with its config.json stops the process at start
with one line naming the file and the field (`ModelError`, exit 2), before it connects to anything:

    model = ModelDir.open(config.model)          # ModelError: model.path unset, or a file/field is wrong
    model.path, model.arch, model.info.tensors   # the resolved directory, config.json, the tensor headers
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre.config.model import ModelSection
from gyre.model.arch import ModelArch
from gyre.model.files import ModelInfo, check_model_dir


@dataclass(frozen=True, slots=True)
class ModelDir:
    """A checked Hugging Face checkpoint directory (`check_model_dir`: config.json, tokenizer, every tensor's
    name and shape, headers only)."""

    path: Path
    """The directory, resolved (what engines load, the trainer starts from and the proxy renders with)."""
    info: ModelInfo
    """What the check found: the architecture, the tensors by name, the safetensors metadata."""

    @property
    def arch(self) -> ModelArch:
        return self.info.arch

    @classmethod
    def open(cls, section: ModelSection) -> ModelDir:
        """The directory `model.path` names, checked; `ModelError` saying how to set it or what is wrong."""
        path = section.require_path().resolve()
        return cls(path, check_model_dir(path))
