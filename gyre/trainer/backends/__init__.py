"""Trainer backends, by name (the config field `cell_agent.trainer.backend`).

    check_trainer(section, model_dir)      # at `gyre up` / service start: LayoutError (a ModelError) → exit 2
    trainer = create_trainer("torch", TrainerSpec(section, model.path, objective, with_optimizer=True))

The registry maps a name to a loader of its class, so a backend's heavy imports (torch, megatron-core:
seconds) happen only when a cell builds that backend, and the config checks its field against the names
here without them. See `base.py` for the interface and how to add
a backend; tests/unit/cell_agent/test_trainer_contract.py runs the contract for every name here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gyre.lazy import lazy_exports

if TYPE_CHECKING:
    from gyre.trainer.backends.base import TrainerBackend, TrainerSpec


def _torch() -> type[TrainerBackend]:
    from gyre.trainer.backends.torch_backend import TorchTrainer

    return TorchTrainer


def _megatron() -> type[TrainerBackend]:
    from gyre.trainer.backends.megatron.trainer import MegatronTrainer

    return MegatronTrainer


TRAINER_BACKENDS: dict[str, Callable[[], type[TrainerBackend]]] = {
    "torch": _torch,
    "megatron": _megatron,
}
"""name → a function returning the backend class (importing its module on first use)."""


def trainer_class(name: str) -> type[TrainerBackend]:
    """The backend class registered as `name` (imports its module)."""
    try:
        load = TRAINER_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"cell_agent.trainer.backend {name!r} is not registered; available: {', '.join(TRAINER_BACKENDS)}"
        ) from None
    return load()


def create_trainer(name: str, spec: TrainerSpec) -> TrainerBackend:
    return trainer_class(name).create(spec)


__getattr__ = lazy_exports(
    __name__,
    {
        "TorchTrainer": "gyre.trainer.backends.torch_backend",
        "TrainerBackend": "gyre.trainer.backends.base",
        "TrainerSpec": "gyre.trainer.backends.base",
        "check_trainer": "gyre.trainer.layout",
    },
)
"""The package's classes, imported on first use (importing the registry stays free of torch)."""


__all__ = [
    "TRAINER_BACKENDS",
    "TorchTrainer",
    "TrainerBackend",
    "TrainerSpec",
    "check_trainer",
    "create_trainer",
    "trainer_class",
]
