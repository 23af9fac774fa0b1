"""Model directories for tests, made by `gyre.model.init` on first use and kept for the session.

    small_dir()                 # a 2-layer Llama, byte tokenizer + compact ChatML (the demo model's format)
    cell_dir()                  # the same format with grouped-query attention, for cell-agent processes
    byte_dir(seed=1, context=4_000_000)   # the demo format at any seed, context and size
    hf_dir("qwen3")             # `gyre model init --arch qwen3 --size tiny` (BPE tokenizer, the family's template)
    family_dir("llama3")        # a tiny model in a chat family's format (BPE tokenizer)
    load_small()                # CausalLM of small_dir(), fp32
    moe_dir(seed=4, num_experts=8)    # a small Qwen3-MoE, byte tokenizer + compact ChatML (dims override)

Nothing is committed: every directory is generated into one temporary root per test process.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gyre.model.architectures import ARCHITECTURES
from gyre.model.causal_lm import CausalLM
from gyre.model.init import init_model_dir
from gyre.model.weights import load_model

_ROOT = Path(tempfile.mkdtemp(prefix="gyre-test-models-"))
atexit.register(shutil.rmtree, _ROOT, True)

SMALL: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 64,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
}
CELL: dict[str, Any] = {
    **SMALL,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
}


MOE_SMALL: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
}
"""A 2-layer Qwen3-MoE (8 experts, top 2) for the routing tests' `moe_dir` (each sets its context)."""
MOE_MIXED: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "mlp_only_layers": [1],
}
"""A 3-layer Qwen3-MoE whose middle layer is dense (routing is recorded per decoder layer, -1 there)."""


@functools.cache
def byte_dir(seed: int = 0, context: int = 1024, **dims: int) -> Path:
    """A Llama in the demo model's format (byte tokenizer, compact ChatML); `dims` override SMALL's
    config.json keys (hidden_size=..., num_hidden_layers=...)."""
    name = "-".join(f"{k}{v}" for k, v in sorted(dims.items()))
    overrides = {**SMALL, **dims, "max_position_embeddings": context}
    return init_model_dir(
        _ROOT / f"byte-{seed}-{context}-{name}",
        arch="llama",
        tokenizer="byte",
        family="chatml",
        seed=seed,
        overrides=overrides,
    )


@functools.cache
def moe_dir(seed: int = 0, **dims: int) -> Path:
    """A small Qwen3-MoE in the demo model's format; `dims` override config.json keys."""
    name = "-".join(f"{k}{v}" for k, v in sorted(dims.items()))
    return init_model_dir(
        _ROOT / f"moe-{seed}-{name}",
        arch="qwen3_moe",
        tokenizer="byte",
        family="chatml",
        seed=seed,
        overrides=dims,
    )


def small_dir(seed: int = 0) -> Path:
    return byte_dir(seed)


def cell_dir(seed: int = 3) -> Path:
    return byte_dir(
        seed,
        CELL["max_position_embeddings"],
        **{k: v for k, v in CELL.items() if k != "max_position_embeddings"},
    )


@functools.cache
def hf_dir(arch: str, size: str = "tiny", seed: int = 0) -> Path:
    return init_model_dir(_ROOT / f"{arch}-{size}-{seed}", arch=arch, size=size, seed=seed)


@functools.cache
def family_dir(family: str) -> Path:
    """A tiny model in a chat family's format: `hf_dir` of the first architecture whose family it is, else a
    tiny Qwen3 given that family's tokenizer and template."""
    arch = next((name for name, record in ARCHITECTURES.items() if record.chat_family == family), None)
    if arch is not None:
        return hf_dir(arch)
    return init_model_dir(_ROOT / f"family-{family}", arch="qwen3", size="tiny", family=family)


def load_small(seed: int = 0) -> CausalLM:
    return load_model(small_dir(seed))


def written_names(hf_model: Any, out: Path) -> set[str]:
    """The parameter names a transformers model writes with `save_pretrained` (a checkpoint's names: for
    Qwen3-MoE the Hub's per-expert ones, not transformers 5's fused in-memory `experts.gate_up_proj`)."""
    from safetensors import safe_open

    hf_model.save_pretrained(out)
    names: set[str] = set()
    for path in out.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            names.update(f.keys())
    return names


def copy_dir(src: Path, dst: Path) -> Path:
    """A writable copy (tests that corrupt a directory must not touch the shared one)."""
    shutil.copytree(src, dst)
    return dst
