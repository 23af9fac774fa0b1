"""Config section of the embedded model (architecture and warm-start checkpoint)."""

from __future__ import annotations

from pathlib import Path

from pydantic import model_validator

from gyre.config.base import AtLeastOne, PositiveFloat, Section


class ModelSection(Section):
    num_layers: AtLeastOne = 4
    """Transformer blocks."""
    d_model: AtLeastOne = 128
    """Hidden size."""
    num_heads: AtLeastOne = 4
    """Attention heads; must divide d_model."""
    ffn_hidden: AtLeastOne = 384
    """SwiGLU hidden size."""
    vocab_size: AtLeastOne = 272
    """Embedding rows; at least the byte tokenizer's vocabulary (256 bytes + specials)."""
    max_seq_len: AtLeastOne = 4096
    """Longest sequence (positions) the model serves or trains on."""
    rope_theta: PositiveFloat = 10000.0
    """Rotary embedding base."""
    checkpoint: Path | None = None
    """Safetensors file to start from (a warm start); None = random init under `seed`."""
    seed: int = 0
    """Seed of the random initialization."""

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSection:
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads must divide d_model; got d_model={self.d_model}, num_heads={self.num_heads}")
        return self
