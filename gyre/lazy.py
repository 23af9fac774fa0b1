"""Names a registry package offers without importing them: the package imports an implementation (torch,
megatron-core, Mooncake) only when one is used, so reading the registry's names stays cheap.

    __getattr__ = lazy_exports(__name__, {"TorchTrainer": "gyre.trainer.backends.torch_backend"})

`from gyre.trainer.backends import TorchTrainer` then imports the module that defines it, on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package` serving each name of `exports` (name → the module that
    defines it) from that module."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
