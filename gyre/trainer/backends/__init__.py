"""Trainer backends, by name (the config field `cell_agent.trainer.backend`).

    check_trainer(section, model_dir)      # at `gyre up` / service start: LayoutError (a ModelError) → exit 2
    trainer = create_trainer("torch", TrainerSpec(section, model_section, objective, with_optimizer=True))

The registry maps a name to a loader of its class, so a backend's heavy imports (megatron-core takes
seconds) happen only when a cell builds that backend. See `base.py` for the interface and how to add
a backend; tests/unit/cell_agent/test_trainer_contract.py runs the contract for every name here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from gyre.config.training import TrainerSection
from gyre.model.arch import ModelError, read_arch
from gyre.trainer.backends.base import TrainerBackend, TrainerSpec
from gyre.trainer.backends.torch_backend import TorchTrainer


def _megatron() -> type[TrainerBackend]:
    from gyre.trainer.backends.megatron.trainer import MegatronTrainer

    return MegatronTrainer


TRAINER_BACKENDS: dict[str, Callable[[], type[TrainerBackend]]] = {
    TorchTrainer.name: lambda: TorchTrainer,
    "megatron": _megatron,
}
"""name → a function returning the backend class (importing its module on first use)."""

_REQUIRED_MODULES = {"megatron": ("megatron.core", "pip install 'gyre[megatron]' (or 'gyre[gpu]' on GPU nodes)")}


def check_trainer(section: TrainerSection, model_dir: Path) -> None:
    """Whether `section.backend` can train the model of `model_dir` with the configured layout, without
    importing the backend or starting any process group: `ModelError` (exit 2) naming the field."""
    if section.backend not in TRAINER_BACKENDS:
        raise ModelError("config", "cell_agent.trainer.backend", f"{section.backend!r} is not registered")
    required = _REQUIRED_MODULES.get(section.backend)
    if required is not None and importlib.util.find_spec(required[0].split(".")[0]) is None:
        raise ModelError(
            "config", "cell_agent.trainer.backend", f"{section.backend!r} needs {required[0]}: {required[1]}"
        )
    if section.backend == "megatron":
        from gyre.trainer.backends.megatron import check_cell_layout, check_megatron_layout

        tp = section.megatron.tensor_parallel_size
        check_megatron_layout(read_arch(model_dir), tensor_parallel_size=tp, source=Path(model_dir) / "config.json")
        check_cell_layout(tp)


def create_trainer(name: str, spec: TrainerSpec) -> TrainerBackend:
    try:
        load = TRAINER_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"cell_agent.trainer.backend {name!r} is not registered; available: {', '.join(TRAINER_BACKENDS)}"
        ) from None
    return load().create(spec)


__all__ = ["TRAINER_BACKENDS", "TorchTrainer", "TrainerBackend", "TrainerSpec", "check_trainer", "create_trainer"]
