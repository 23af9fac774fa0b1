"""Config section of the model: the Hugging Face checkpoint directory every engine and trainer uses."""

from __future__ import annotations

from pathlib import Path

from gyre.config.base import Section
from gyre.model.arch import ModelError


class ModelSection(Section):
    path: Path | None = None
    """Hugging Face checkpoint directory: config.json (Llama / Qwen2 / Qwen3 dense), model.safetensors
    or shards with model.safetensors.index.json, tokenizer.json + tokenizer_config.json (chat
    template), generation_config.json when present. Engines serve it, the core trains from it (or from
    its newest checkpoint), the proxy renders with its chat template. Make a tiny one with
    `gyre model init`; the demo sets the warm start (`harness/demo_model/checkpoints/warmstart`). Checked when a
    service starts (`gyre.model.check_model_dir`), not when the config is read."""

    def require_path(self) -> Path:
        """The directory, or a `ModelError` saying how to set it. A service reads it once, at its start,
        through `gyre.model.model_dir.ModelDir.open`, and hands that object on."""
        if self.path is None:
            raise ModelError(
                "config",
                "model.path",
                "not set: give a Hugging Face checkpoint directory (`gyre model init --out DIR` makes a tiny "
                "one; the demo uses harness/demo_model/checkpoints/warmstart)",
            )
        return self.path
