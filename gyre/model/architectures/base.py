"""The extension point of model architectures: what one Hugging Face `*ForCausalLM` class is to Gyre.

Every architecture Gyre serves and trains is one record: the `architectures` entry of config.json it
reads (`hf_class`), the transformers config defaults it relies on when a key is absent, the switches its
config sets on the shared decoder (`gyre.model.arch.ModelArch`: biases, q/k norm), the config.json keys
`gyre model init --arch NAME` writes, and the chat family a new model of it gets.

    record = ARCHITECTURES["qwen3"]                 # by the name of `gyre model init --arch`
    record = by_hf_class("Qwen3ForCausalLM")        # by config.json's `architectures`

To add an architecture: write `gyre/model/architectures/<name>.py` with a subclass of `Architecture`
that sets every class attribute and implements `switches` and `init_config`, and add an instance to
`ARCHITECTURES` in `gyre/model/architectures/__init__.py`. The contract test
tests/unit/model/test_architectures.py runs every registered name: a directory made by `gyre model
init`, read back, its parameters named as `ModelArch.parameter_shapes` says, a forward pass, its chat
family recognized. What the shared decoder cannot express yet (experts, another attention) goes into
`ModelArch`, `gyre.model.causal_lm` and the trainer backends' weight mapping.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

Flag = Callable[[str], bool]
"""Reads a true/false key of config.json (a missing key is false; anything but a bool is refused)."""


@dataclass(frozen=True, slots=True)
class Switches:
    """What an architecture's config turns on in the shared decoder."""

    qkv_bias: bool = False
    """Bias on the q/k/v projections."""
    o_bias: bool = False
    """Bias on the output projection."""
    mlp_bias: bool = False
    """Bias on the gate/up/down projections."""
    qk_norm: bool = False
    """RMSNorm over each head of q and k before rotary."""


class Architecture(ABC):
    name: ClassVar[str]
    """`gyre model init --arch NAME`."""
    hf_class: ClassVar[str]
    """config.json's `architectures` entry (`Qwen3ForCausalLM`)."""
    model_type: ClassVar[str]
    """config.json's `model_type`."""
    chat_family: ClassVar[str]
    """The chat family (`gyre.model.families.FAMILIES`) `gyre model init` gives a model of it."""
    config_defaults: ClassVar[Mapping[str, Any]]
    """The transformers config class defaults Gyre relies on when config.json omits a key."""
    default_num_kv_heads: ClassVar[int | None] = None
    """`num_key_value_heads` when config.json omits it; None = `num_attention_heads` (no GQA)."""
    experts: ClassVar[bool] = False
    """config.json describes mixture-of-experts layers (`gyre.model.arch.read_moe` reads them)."""

    @abstractmethod
    def switches(self, flag: Flag) -> Switches:
        """The decoder switches a config of this architecture sets."""

    @abstractmethod
    def init_config(self, num_layers: int) -> dict[str, Any]:
        """The architecture's own config.json keys of a `gyre model init` directory (rope_theta, tied
        embeddings, bias switches); the shapes are the size preset's."""
