"""The `torch` trainer backend: the checkpoint's `CausalLM` (the embedded engine's model, the same HF
parameter names) trained on packed micro-steps with the GSPO-variant objective, AdamW on the core.

Parameters and gradients live in flat buffers (`gyre.trainer.flat`), so the reduction of a step is
one collective over `flat_grads` and a snapshot is one read of `flat_params`. `accumulate` runs
`gyre.rl.step_loss.train_microstep` (one pass, or the chunked two-pass path for a micro-step over its
budget); every target carries 1/(L_i·B·N), so the gradients of any split of a batch add up to the
batch gradient. `optimizer_step` clips the summed gradient by its global norm, steps AdamW (constant
lr), zeroes the gradients and bumps the version.

With `trainer.lora` the checkpoint's weights are frozen (no gradient, no optimizer state) and a
`gyre.model.lora.LoraAdapter` is trained on top: its matrices are the flat buffers (so a snapshot, a
satellite's pull and the gradient reduction are the adapter's bytes only), AdamW steps them alone,
checkpoints and publications are PEFT adapter directories.

    trainer = TorchTrainer.create(TrainerSpec(section, model.path, objective, with_optimizer=True))
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from gyre.model.arch import ModelArch
from gyre.model.causal_lm import CausalLM
from gyre.model.lora import LoraAdapter
from gyre.model.lora_spec import LoraSpec
from gyre.model.routing import ExpertRouting
from gyre.model.tree_layout import TreeLayout
from gyre.model.weights import load_model
from gyre.rl.microstep import MicroStep
from gyre.rl.step_loss import StepResult, train_microstep
from gyre.trainer.backends.base import TrainerBackend, TrainerSpec
from gyre.trainer.checkpoint import read_adapter_checkpoint, read_trainer_checkpoint, save_trainer_checkpoint
from gyre.trainer.flat import FlatParameters
from gyre.trainer.offload import optimizer_tensors
from gyre.trainer.optimizer import build_adamw, clip_flat_grads

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


class TorchTrainer(TrainerBackend):
    name: ClassVar[str] = "torch"

    def __init__(self, spec: TrainerSpec, model: CausalLM, version: int | None) -> None:
        section = spec.section
        if section.routing_replay and model.arch.moe is None:
            raise ValueError(
                f"cell_agent.trainer.routing_replay needs an MoE model; {model.arch.architecture} is dense: "
                "set routing_replay: false"
            )
        self.spec = spec
        self.device = torch.device(section.device)
        dtype = _DTYPES[section.dtype]
        self.model = model.to(device=self.device, dtype=dtype).train()
        self._adapter: LoraAdapter | None = None
        if section.lora is not None:
            lora = section.lora
            self.model.requires_grad_(False)
            self._adapter = (
                LoraAdapter(
                    model.arch,
                    LoraSpec(
                        lora.rank, lora.alpha, lora.dropout, tuple(lora.target_modules), lora.use_rslora
                    ),
                )
                .init_weights(lora.seed)
                .to(device=self.device, dtype=dtype)
                .train()
            )
            self.flat = FlatParameters(self._adapter, self._adapter.named_lora())
            trained = list(self._adapter.parameters())
        else:
            self.flat = FlatParameters(self.model)
            trained = list(self.model.parameters())
        self.optimizer = build_adamw(trained, section) if spec.with_optimizer else None
        self.version = version

    @classmethod
    def create(cls, spec: TrainerSpec) -> TorchTrainer:
        """The initial weights of the run: the `model.path` directory (version 0)."""
        return cls(spec, load_model(spec.model_dir, _DTYPES[spec.section.dtype]), version=0)

    @property
    def arch(self) -> ModelArch:
        return self.model.arch

    @property
    def adapter(self) -> LoraAdapter | None:
        return self._adapter

    def logits(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        tree: TreeLayout | None,
        routed_experts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The packed forward of the trained policy (the base, plus the adapter under LoRA);
        `routed_experts` [T, L·k]: the engine's experts to replay (routing replay)."""
        routing = None
        if routed_experts is not None:
            moe = self.model.arch.moe
            assert moe is not None, "routing replay on a dense model (refused at creation)"
            layers, k = self.model.arch.num_layers, moe.num_experts_per_tok
            if routed_experts.shape[1] != layers * k:
                raise ValueError(
                    f"routed experts hold {routed_experts.shape[1]} ids per token; this model routes "
                    f"{layers} layers x {k} experts"
                )
            routing = ExpertRouting(replay=routed_experts.view(-1, layers, k))
        return self.model(input_ids, position_ids, cu_seqlens, tree, lora=self._adapter, routing=routing)

    @property
    def flat_params(self) -> torch.Tensor:
        return self.flat.params

    @property
    def flat_grads(self) -> torch.Tensor:
        return self.flat.grads

    def zero_grads(self) -> None:
        self.flat.zero_grads()

    def accumulate(self, step: MicroStep) -> StepResult:
        return train_microstep(
            step,
            self.logits,
            objective=self.spec.objective,
            chunk_tokens=self.spec.section.chunk_tokens,
            device=self.device,
            routing_replay=self.spec.section.routing_replay,
        )

    def optimizer_step(self) -> float:
        if self.optimizer is None:
            raise RuntimeError("this trainer has no optimizer: only the core takes optimizer steps")
        if self.version is None:
            raise RuntimeError("optimizer step on weights of unknown version")
        norm = clip_flat_grads(self.flat.grads, self.spec.section.grad_clip)
        self.optimizer.step()
        self.flat.zero_grads()
        self.flat.check_views()
        self.version += 1
        return norm

    def named_weights(self) -> dict[str, torch.Tensor]:
        return self.flat.named_tensors()

    def load_weights(self, tensors: Mapping[str, torch.Tensor], version: int | None) -> None:
        self.flat.load_named(tensors)
        self.version = version

    def save_checkpoint(self, directory: Path) -> Path:
        if self.version is None:
            raise RuntimeError("cannot checkpoint weights of unknown version")
        return save_trainer_checkpoint(
            directory,
            version=self.version,
            arch=self.arch,
            tensors=self.named_weights(),
            optimizer=self.optimizer,
            backend=self.name,
            source=self.spec.model_dir,
            keep=self.spec.section.keep_checkpoints,
            adapter=self._adapter,
        )

    def load_checkpoint(self, path: Path) -> None:
        if self._adapter is not None:
            adapter, optimizer_state, version = read_adapter_checkpoint(
                path, self.arch, self.flat.params.dtype
            )
            if adapter.targets != self._adapter.targets or adapter.spec.rank != self._adapter.spec.rank:
                raise ValueError(
                    f"checkpoint {path} holds an adapter of rank {adapter.spec.rank} on other modules than "
                    "cell_agent.trainer.lora configures"
                )
            self._load(adapter.tensors(), optimizer_state, version)
            return
        arch, tensors, optimizer_state, version = read_trainer_checkpoint(path, self.flat.params.dtype)
        if arch.fingerprint() != self.arch.fingerprint():
            raise ValueError(
                f"checkpoint {path} has a different architecture than model.path ({self.arch.architecture})"
            )
        self._load(tensors, optimizer_state, version)

    def _load(
        self, tensors: Mapping[str, torch.Tensor], optimizer_state: dict[str, Any] | None, version: int
    ) -> None:
        self.flat.load_named(tensors)
        if self.optimizer is not None and optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self.version = version

    def digest(self) -> str:
        return self.flat.digest()

    def state_tensors(self) -> list[torch.Tensor]:
        return [*super().state_tensors(), *optimizer_tensors(self.optimizer)]
