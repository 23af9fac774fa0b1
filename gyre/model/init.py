"""`gyre model init`: a random-init Hugging Face model directory with a locally trained tokenizer.

Tests, demos and benchmarks need real HF checkpoints on machines that cannot reach a hub, so Gyre
makes them: config.json of the architecture at a preset size, seeded N(0, 0.02) weights, a
generation_config.json, and a tokenizer of the family with its special tokens and chat template
(`bpe` trained on the text Gyre ships, or `byte`; see `gyre.model.vocab`).

    out = init_model_dir(Path("/tmp/qwen3-tiny"), arch="qwen3", size="tiny", seed=0)

`gyre model init --arch qwen3 --size tiny --out DIR` is the command-line form.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from gyre.model.arch import arch_from_config
from gyre.model.architectures import Architecture, architecture
from gyre.model.causal_lm import CausalLM
from gyre.model.families import FAMILIES, ChatFamily
from gyre.model.tokenizer import GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from gyre.model.vocab import build_tokenizer
from gyre.model.weights import write_model_dir


@dataclass(frozen=True, slots=True)
class Size:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 32768


SIZES = {
    "tiny": Size(
        hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384, vocab_size=8192
    ),
    "small": Size(
        hidden_size=256, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=768, vocab_size=16384
    ),
}
EMBEDDED_DEFAULT: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "intermediate_size": 384,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
}
"""config.json keys of the embedded default's model (the demo's warm start: a Llama, 0.9 M parameters
with the byte tokenizer and the `chatml` family): `init_model_dir(..., arch="llama", tokenizer="byte",
family="chatml", overrides=EMBEDDED_DEFAULT)`."""


def _config(
    record: Architecture, size: Size, vocab_size: int, family: ChatFamily, tok: Tokenizer, dtype: str
) -> dict[str, Any]:
    head_dim = size.hidden_size // size.num_heads
    eos = tok.token_to_id(family.eos_token)
    config: dict[str, Any] = {
        "architectures": [record.hf_class],
        "model_type": record.model_type,
        "hidden_size": size.hidden_size,
        "intermediate_size": size.intermediate_size,
        "num_hidden_layers": size.num_layers,
        "num_attention_heads": size.num_heads,
        "num_key_value_heads": size.num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": size.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": dtype,
        "bos_token_id": tok.token_to_id(family.bos_token) if family.bos_token else None,
        "eos_token_id": eos,
        **record.init_config(size.num_layers),
    }
    return config


def _tokenizer_config(family: ChatFamily, max_positions: int) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": family.bos_token,
        "eos_token": family.eos_token,
        "pad_token": family.pad_token,
        "unk_token": None,
        "model_max_length": max_positions,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": family.chat_template,
    }


def init_model_dir(
    out: Path,
    *,
    arch: str = "qwen3",
    size: str = "tiny",
    seed: int = 0,
    tokenizer: str = "bpe",
    family: str | None = None,
    vocab_size: int | None = None,
    max_position_embeddings: int | None = None,
    dtype: str = "float32",
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Write a random-init model directory (see the module docstring); returns `out`."""
    record = architecture(arch)
    if size not in SIZES:
        raise ValueError(f"--size must be one of {', '.join(SIZES)}; got {size!r}")
    chat = FAMILIES.get(family or record.chat_family)
    if chat is None:
        raise ValueError(f"--family must be one of {', '.join(FAMILIES)}; got {family!r}")
    preset = SIZES[size]
    if max_position_embeddings is not None:
        preset = replace(preset, max_position_embeddings=max_position_embeddings)
    tok = build_tokenizer(chat, tokenizer, vocab_size or preset.vocab_size)
    total_vocab = tok.get_vocab_size(with_added_tokens=True)
    config = {**_config(record, preset, total_vocab, chat, tok, dtype), **(overrides or {})}
    model_arch = arch_from_config(config)
    model = CausalLM(model_arch).init_weights(seed)
    with tempfile.TemporaryDirectory(prefix="gyre-init-") as scratch:
        files = Path(scratch)
        tok.save(str(files / TOKENIZER_FILE))
        (files / TOKENIZER_CONFIG_FILE).write_text(
            json.dumps(_tokenizer_config(chat, preset.max_position_embeddings), indent=2) + "\n"
        )
        eos_ids = [tok.token_to_id(t) for t in chat.stop_tokens]
        generation = {
            "eos_token_id": eos_ids,
            "pad_token_id": tok.token_to_id(chat.pad_token) if chat.pad_token else None,
        }
        if chat.bos_token:
            generation["bos_token_id"] = tok.token_to_id(chat.bos_token)
        (files / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2) + "\n")
        tensors = dict(model.named_parameters())
        write_model_dir(Path(out), arch=model_arch, tensors=tensors, source=files, dtype=dtype)
    return Path(out)
