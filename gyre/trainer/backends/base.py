"""The extension point of the training role: what computes gradients and owns the optimizer.

A cell in the training role drives its backend through this interface only:

    trainer.zero_grads()
    for step in claimed_microsteps:
        trainer.accumulate(step)           # forward + backward; gradients add up in `flat_grads`
    dist.reduce(trainer.flat_grads, dst=0) # the cell agent's collectives (SUM over the participants)
    grad_norm = trainer.optimizer_step()   # core only: clip, one AdamW step, version + 1

Weights are frozen between two optimizer steps: `accumulate` never changes `flat_params`, which is
what lets a satellite read the core's buffer while the core is computing.

To add a backend (Megatron on clusters): subclass `TrainerBackend`, set `name`, implement every
abstract member, and add the class to `TRAINER_BACKENDS` in `gyre/trainer/backends/__init__.py`; the
config field `cell_agent.trainer.backend` selects it and the contract tests in
tests/unit/cell_agent/test_trainer_contract.py run every registered backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from gyre.config.training import TrainerSection
from gyre.model.arch import ModelArch
from gyre.model.lora import LoraAdapter
from gyre.rl.loss import ObjectiveParams
from gyre.rl.microstep import MicroStep
from gyre.rl.step_loss import StepResult


@dataclass(frozen=True, slots=True)
class TrainerSpec:
    """Everything a backend is built from."""

    section: TrainerSection
    model_dir: Path
    """The run's model directory (`gyre.model.model_dir.ModelDir.path`: checked at the service's start), the
    weights a trainer starts from and the source its checkpoints copy tokenizer files from."""
    objective: ObjectiveParams
    with_optimizer: bool
    """True on the core (the only optimizer); satellites compute gradients only."""


class TrainerBackend(ABC):
    name: ClassVar[str]

    needs_world: ClassVar[bool] = False
    """True when building the backend needs torch.distributed's default world to exist (megatron-core
    resolves its groups through it): a cell agent of a multi-cell run then builds it once it has joined
    the cells' world, and a single cell starts a world of its own process."""

    version: int | None
    """Policy version of the weights held; None until the weights are known (a satellite that has
    not pulled a snapshot yet)."""

    @classmethod
    @abstractmethod
    def create(cls, spec: TrainerSpec) -> TrainerBackend: ...

    @property
    @abstractmethod
    def arch(self) -> ModelArch:
        """The architecture of the weights (what published directories and engines must match)."""

    @property
    def adapter(self) -> LoraAdapter | None:
        """The LoRA adapter trained on the frozen base (`cell_agent.trainer.lora`), else None: then
        `flat_params`, `named_weights` and checkpoints hold the adapter's matrices only, and a
        publication is a PEFT adapter directory."""
        return None

    @property
    @abstractmethod
    def flat_params(self) -> torch.Tensor:
        """All trained weights, one contiguous buffer at a fixed address (snapshots are read from it and
        pulled into it): every weight, or the adapter's matrices under LoRA."""

    @property
    @abstractmethod
    def flat_grads(self) -> torch.Tensor:
        """All gradients, one contiguous buffer shaped like `flat_params`."""

    @abstractmethod
    def zero_grads(self) -> None: ...

    @abstractmethod
    def accumulate(self, step: MicroStep) -> StepResult:
        """Forward and backward of one micro-step; gradients add into `flat_grads`."""

    @abstractmethod
    def optimizer_step(self) -> float:
        """Clip the (already reduced) gradients, take one optimizer step, zero the gradients, bump
        `version`; returns the gradient norm before clipping. Core only."""

    @abstractmethod
    def named_weights(self) -> dict[str, torch.Tensor]:
        """Hugging Face name → full parameter (views; copy before the next optimizer step if you keep
        them). What publication writes and engines load."""

    @abstractmethod
    def load_weights(self, tensors: Mapping[str, torch.Tensor], version: int | None) -> None: ...

    @abstractmethod
    def save_checkpoint(self, directory: Path) -> Path:
        """Write model + optimizer + version under `directory` as an HF directory; returns its path."""

    @abstractmethod
    def load_checkpoint(self, path: Path) -> None: ...

    @abstractmethod
    def digest(self) -> str:
        """SHA-256 of the weight bytes (`flat_params`)."""

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor the trainer keeps between steps (parameters, gradients, optimizer state): what a
        GPU cell may offload while it serves (`gyre.trainer.offload`). Backends add their optimizer's."""
        return [self.flat_params, self.flat_grads]
