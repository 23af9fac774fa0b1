"""The `megatron` trainer backend: a megatron-core GPTModel shard per TP rank of a cell, trained on
packed micro-steps (path and tree rows) with the Gyre objective; AdamW on the core.

    trainer = MegatronTrainer.create(spec)                         # model.path, TP 1 (the cell agent)
    trainer = MegatronTrainer(spec, arch, hf_tensors, tp_group=g)  # every TP rank of a cell, same inputs
    trainer.zero_grads()
    for step in claimed_microsteps:
        trainer.accumulate(step)              # every TP rank of the cell, same micro-step
    <reduce trainer.flat_grads over the cells, per TP rank>
    trainer.optimizer_step()                  # core only

What the base interface means here:

- `flat_params` / `flat_grads` are this TP rank's shard in Megatron's layout (fused QKV, fused
  gate/up), the fastest thing to move: cells share one layout, so a satellite's TP rank r pulls the
  core's rank-r buffer and the reduction runs rank by rank. HF names and full shapes only where the
  weights leave the trainer: `named_weights()` (publication, a collective of the TP group) and
  checkpoints (HF directories of `gyre.trainer.checkpoint`, plus one optimizer shard per TP rank).
- `accumulate` runs `gyre.rl.step_loss.train_microstep` with `model.packed_logits` as the logits
  function — tree-packed rows included, with the torch backend's attention — then sums the
  TP-partial q/k-norm gradients.
- `optimizer_step` clips by the TP-global norm, steps torch AdamW, bumps the version. On GPUs
  Megatron's DistributedOptimizer is the intended path (`distributed_optimizer.py`, untested: no
  GPU on the machines that built this).
- `architecture.LayoutError` (a `ModelError`: exit 2) for a model or layout megatron cannot build,
  raised before any process group is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.distributed as dist

from gyre.model.arch import ModelArch
from gyre.model.files import check_model_dir
from gyre.model.tree_layout import TreeLayout
from gyre.model.weights import load_state_dict, torch_dtype
from gyre.rl.microstep import MicroStep
from gyre.rl.step_loss import StepResult, train_microstep
from gyre.trainer.backends.base import TrainerBackend, TrainerSpec
from gyre.trainer.backends.megatron.architecture import check_cell_layout, check_megatron_layout
from gyre.trainer.backends.megatron.model import (
    build_gpt_model,
    ensure_world,
    packed_logits,
    solo_group,
    uses_transformer_engine,
)
from gyre.trainer.backends.megatron.parameters import FlatShard
from gyre.trainer.backends.megatron.weights import check_hf_tensors, hf_to_megatron, megatron_to_hf
from gyre.trainer.checkpoint import (
    read_trainer_checkpoint,
    read_trainer_info,
    save_trainer_checkpoint,
    staged_dir,
    step_dir,
)
from gyre.trainer.flat import weights_digest

if TYPE_CHECKING:
    from gyre.trainer.backends.megatron.distributed_optimizer import DistributedShard


def optimizer_filename(tp_rank: int, tp_size: int) -> str:
    """The optimizer shard of one TP rank inside a checkpoint directory."""
    return f"optimizer-tp{tp_rank}-of-{tp_size}.pt"


def params_dtype(spec: TrainerSpec) -> torch.dtype:
    """`trainer.megatron.params_dtype`, else `trainer.dtype`."""
    return torch_dtype(spec.section.megatron.params_dtype or spec.section.dtype)


class MegatronTrainer(TrainerBackend):
    name: ClassVar[str] = "megatron"
    needs_world: ClassVar[bool] = True

    def __init__(
        self,
        spec: TrainerSpec,
        arch: ModelArch,
        hf_tensors: Mapping[str, torch.Tensor],
        *,
        tp_group: dist.ProcessGroup | None = None,
        version: int | None = 0,
        source: Path | None = None,
    ) -> None:
        """`hf_tensors`: the HF-named weights of `arch` (every rank passes all of them and keeps its
        shard); `source`: the HF directory whose tokenizer files checkpoints copy (default model.path)."""
        check_megatron_layout(arch, tensor_parallel_size=1 if tp_group is None else tp_group.size())
        check_hf_tensors(arch, hf_tensors)
        self.spec = spec
        self._arch = arch
        self.source = source
        self.device = torch.device(spec.section.device)
        dtype = params_dtype(spec)
        if tp_group is None:
            ensure_world(self.device)
        self.tp_group = tp_group if tp_group is not None else solo_group(self.device)
        self.tp_rank, self.tp_size = self.tp_group.rank(), self.tp_group.size()
        self.fused_norms = uses_transformer_engine(self.device)
        self.model = build_gpt_model(arch, tp_group=self.tp_group, device=self.device, params_dtype=dtype)
        self.model.train()
        self.store: FlatShard | DistributedShard
        if self.device.type == "cuda":  # untested: no GPU where this was built
            from gyre.trainer.backends.megatron.distributed_optimizer import DistributedShard

            self.store = DistributedShard(
                self.model, self.tp_group, spec.section, with_optimizer=spec.with_optimizer
            )
        else:
            self.store = FlatShard(
                self.model, self.tp_group, spec.section, with_optimizer=spec.with_optimizer
            )
        self.store.load_named(self._shard_of(hf_tensors))
        self.version = version

    @classmethod
    def create(cls, spec: TrainerSpec) -> MegatronTrainer:
        """The initial weights of the run: the `model.path` directory (version 0), one process (TP 1)."""
        check_cell_layout(spec.section.megatron.tensor_parallel_size)
        path = spec.model_dir
        info = check_model_dir(path)
        return cls(spec, info.arch, load_state_dict(info, params_dtype(spec)), version=0, source=path)

    def _shard_of(self, hf_tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return hf_to_megatron(
            self._arch, hf_tensors, tp_rank=self.tp_rank, tp_size=self.tp_size, fused_norms=self.fused_norms
        )

    @property
    def arch(self) -> ModelArch:
        return self._arch

    @property
    def flat_params(self) -> torch.Tensor:
        return self.store.params

    @property
    def flat_grads(self) -> torch.Tensor:
        return self.store.grads

    def zero_grads(self) -> None:
        self.store.zero_grads()

    def logits(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        tree: TreeLayout | None = None,
    ) -> torch.Tensor:
        """The packed logits function of `gyre.rl.step_loss` (a TP collective when TP > 1)."""
        return packed_logits(self.model, input_ids, position_ids, cu_seqlens, tree)

    def accumulate(self, step: MicroStep) -> StepResult:
        before = self.store.partial_grads()
        result = train_microstep(
            step,
            self.logits,
            objective=self.spec.objective,
            chunk_tokens=self.spec.section.chunk_tokens,
            device=self.device,
        )
        self.store.sum_partial_grads(before)
        return result

    def optimizer_step(self) -> float:
        if self.version is None:
            raise RuntimeError("optimizer step on weights of unknown version")
        norm = self.store.step(self.spec.section.grad_clip)
        self.version += 1
        return norm

    def _gathered_shards(self) -> list[dict[str, torch.Tensor]]:
        mine = self.store.named_tensors()
        if self.tp_size == 1:
            return [mine]
        shards: list[dict[str, torch.Tensor]] = [{} for _ in range(self.tp_size)]
        for name, t in mine.items():
            parts = [torch.empty_like(t) for _ in range(self.tp_size)]
            dist.all_gather(parts, t.contiguous(), group=self.tp_group)
            for r, part in enumerate(parts):
                shards[r][name] = part
        return shards

    def named_weights(self) -> dict[str, torch.Tensor]:
        """HF name → full tensor (new tensors, gathered over the TP group: every TP rank must call it)."""
        return megatron_to_hf(self._arch, self._gathered_shards(), fused_norms=self.fused_norms)

    def load_weights(self, tensors: Mapping[str, torch.Tensor], version: int | None) -> None:
        """HF-named full tensors in; each TP rank keeps its shard."""
        self.store.load_named(self._shard_of(tensors))
        self.version = version

    def save_checkpoint(self, directory: Path) -> Path:
        """An HF checkpoint directory (`gyre.trainer.checkpoint`) plus each TP rank's optimizer shard.
        A collective of the TP group: rank 0 writes the weights and commits, every rank its shard."""
        if self.version is None:
            raise RuntimeError("cannot checkpoint weights of unknown version")
        version = self.version
        weights = self.named_weights()

        def write_shard(staged: Path) -> None:
            state = self.store.optimizer_state()
            if state is not None:
                torch.save(state, staged / optimizer_filename(self.tp_rank, self.tp_size))

        def write_shards(staged: Path) -> None:  # rank 0, between weights and trainer.json
            self._barrier()  # the staged directory exists
            write_shard(staged)
            self._barrier()  # every rank has written its shard

        if self.tp_rank == 0:
            save_trainer_checkpoint(
                directory,
                version=version,
                arch=self._arch,
                tensors=weights,
                optimizer=None,
                backend=self.name,
                source=self.source or self.spec.model_dir,
                keep=self.spec.section.keep_checkpoints,
                write_extra=write_shards,
                info={"tensor_parallel_size": self.tp_size},
            )
        else:
            self._barrier()
            write_shard(staged_dir(directory, version))
            self._barrier()
        self._barrier()  # committed
        return step_dir(directory, version)

    def load_checkpoint(self, path: Path) -> None:
        info = read_trainer_info(path)
        if info.get("backend") != self.name:
            raise ValueError(
                f"checkpoint {path} was written by the {info.get('backend')!r} backend: its optimizer state "
                f"does not fit the megatron backend; resume with cell_agent.trainer.backend: "
                f"{info.get('backend')}, or start from its weights with model.path: {path}"
            )
        arch, tensors, _, version = read_trainer_checkpoint(path, params_dtype(self.spec))
        if arch.fingerprint() != self._arch.fingerprint():
            raise ValueError(
                f"checkpoint {path} has a different architecture than model.path ({self._arch.architecture})"
            )
        optimizer_path = Path(path) / optimizer_filename(self.tp_rank, self.tp_size)
        if self.store.optimizer is not None and not optimizer_path.is_file():
            raise ValueError(
                f"checkpoint {path} has no optimizer shard for TP rank {self.tp_rank} of {self.tp_size} "
                f"(written with tensor_parallel_size {info.get('tensor_parallel_size')})"
            )
        self.store.load_named(self._shard_of(tensors))
        if self.store.optimizer is not None:
            self.store.load_optimizer_state(torch.load(optimizer_path, weights_only=True))
        self.version = version

    def digest(self) -> str:
        """SHA-256 of this TP rank's shard (`flat_params`)."""
        return weights_digest(self.store.params)

    def state_tensors(self) -> list[torch.Tensor]:
        return self.store.state_tensors()

    def _barrier(self) -> None:
        if self.tp_size > 1:
            dist.barrier(group=self.tp_group)
