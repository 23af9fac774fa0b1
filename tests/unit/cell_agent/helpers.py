"""Shared pieces of the cell agent unit tests: a small trainer spec and synthetic batches."""

from __future__ import annotations

from typing import Any

from gyre.config.model import ModelSection
from gyre.config.training import TrainerSection
from gyre.model.causal_lm import CausalLM
from gyre.model.weights import load_model
from gyre.rl.loss import ObjectiveParams
from gyre.rl.microstep import MicroStep
from gyre.trainer.backends import TrainerSpec, create_trainer
from gyre.trainer.backends.base import TrainerBackend
from gyre.trainer.synthetic import synthetic_microsteps
from tests.support.models import small_dir

SMALL_DIR = small_dir(5)
SMALL = ModelSection(path=SMALL_DIR)


def spec(*, with_optimizer: bool = True, **trainer: Any) -> TrainerSpec:
    return TrainerSpec(TrainerSection(**trainer), SMALL_DIR, ObjectiveParams(), with_optimizer=with_optimizer)


def trainer(name: str = "torch", *, with_optimizer: bool = True, **section: Any) -> TrainerBackend:
    return create_trainer(name, spec(with_optimizer=with_optimizer, **section))


def batch(
    t: Any, *, seed: int = 0, step: int = 0, num_groups: int = 3, token_budget: int = 200
) -> list[MicroStep]:
    """Micro-steps with the trainer's own log-probs as behaviour (the model directory's CausalLM for a
    backend whose model is not one, e.g. megatron's GPTModel)."""
    model = t.model if isinstance(t.model, CausalLM) else load_model(t.spec.model_dir)
    return synthetic_microsteps(
        model,
        batch_id=f"b{seed}",
        step=step,
        num_groups=num_groups,
        group_size=3,
        token_budget=token_budget,
        max_row_tokens=90,
        seed=seed,
    )
