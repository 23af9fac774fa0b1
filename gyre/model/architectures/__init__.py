"""Model architectures, by name (`gyre model init --arch NAME`) and by config.json class.

    record = ARCHITECTURES["llama"]
    record = by_hf_class(raw["architectures"][0])      # None when Gyre does not run it

See `base.py` for what a record says and how to add one; tests/unit/model/test_architectures.py runs
the contract for every name here.
"""

from __future__ import annotations

from gyre.model.architectures.base import Architecture, Flag, Switches
from gyre.model.architectures.llama import Llama
from gyre.model.architectures.qwen2 import Qwen2
from gyre.model.architectures.qwen3 import Qwen3
from gyre.model.architectures.qwen3_moe import Qwen3Moe

ARCHITECTURES: dict[str, Architecture] = {
    record.name: record for record in (Qwen3(), Qwen3Moe(), Qwen2(), Llama())
}
"""name → record, the default of `gyre model init` first."""

HF_CLASSES: tuple[str, ...] = tuple(record.hf_class for record in ARCHITECTURES.values())
"""Every config.json `architectures` entry Gyre runs."""


def by_hf_class(hf_class: object) -> Architecture | None:
    """The record whose config.json class is `hf_class`, or None."""
    return next((r for r in ARCHITECTURES.values() if r.hf_class == hf_class), None)


def architecture(name: str) -> Architecture:
    """The record registered as `name`; ValueError names the registered ones."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"--arch must be one of {', '.join(ARCHITECTURES)}; got {name!r}") from None


__all__ = ["ARCHITECTURES", "HF_CLASSES", "Architecture", "Flag", "Switches", "architecture", "by_hf_class"]
