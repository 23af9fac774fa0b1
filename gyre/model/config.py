"""The architecture of the embedded model as a frozen value, shared by the engine, trainer and checkpoints.

`ModelConfig` mirrors `gyre.config.model.ModelSection` (the YAML-facing config) minus the fields that
are about *where weights come from* (checkpoint path, seed). It is what a checkpoint stores in its
metadata, so two configs compare equal exactly when their parameter shapes and semantics agree.

    config = ModelConfig.from_section(load_config(None).model)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from gyre.config.model import ModelSection
from gyre.model.tokenizer import ByteTokenizer


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes of GyreLM. The defaults are the tiny size that runs comfortably on 2 CPU cores."""

    num_layers: int = 4
    d_model: int = 128
    num_heads: int = 4
    ffn_hidden: int = 384
    vocab_size: int = 272
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("num_layers", "d_model", "num_heads", "ffn_hidden", "vocab_size", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"num_heads must divide d_model; got d_model={self.d_model}, num_heads={self.num_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim (d_model / num_heads) must be even for rotary embeddings; got {self.head_dim}"
            )
        if self.vocab_size < ByteTokenizer().vocab_size:
            raise ValueError(
                f"vocab_size must cover the byte tokenizer ({ByteTokenizer().vocab_size} ids); got {self.vocab_size}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @classmethod
    def from_section(cls, section: ModelSection) -> ModelConfig:
        return cls(
            num_layers=section.num_layers,
            d_model=section.d_model,
            num_heads=section.num_heads,
            ffn_hidden=section.ffn_hidden,
            vocab_size=section.vocab_size,
            max_seq_len=section.max_seq_len,
            rope_theta=section.rope_theta,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        data: dict[str, Any] = json.loads(text)
        return cls(**data)

    def fingerprint(self) -> str:
        """A short stable id of the architecture: KV blocks move only between equal fingerprints."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]
