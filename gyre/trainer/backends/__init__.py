"""Trainer backends, by name (the config field `cell_agent.trainer.backend`).

    trainer = create_trainer("torch", TrainerSpec(section, model_section, objective, with_optimizer=True))

See `base.py` for the interface and how to add a backend.
"""

from __future__ import annotations

from gyre.trainer.backends.base import TrainerBackend, TrainerSpec
from gyre.trainer.backends.torch_backend import TorchTrainer

TRAINER_BACKENDS: dict[str, type[TrainerBackend]] = {
    TorchTrainer.name: TorchTrainer,
}


def create_trainer(name: str, spec: TrainerSpec) -> TrainerBackend:
    try:
        cls = TRAINER_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"cell_agent.trainer.backend {name!r} is not registered; available: {', '.join(TRAINER_BACKENDS)}"
        ) from None
    return cls.create(spec)


__all__ = ["TRAINER_BACKENDS", "TorchTrainer", "TrainerBackend", "TrainerSpec", "create_trainer"]
