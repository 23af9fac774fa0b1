"""The `megatron` trainer backend: a megatron-core GPTModel shard per TP rank of a cell, trained on
packed micro-steps with the Gyre objective; AdamW on the core.

Built from an HF model (config.json dict + HF-named tensors), so it does not depend on how the run
loads its model; every TP rank of the cell constructs it with the same inputs and its TP group:

    trainer = MegatronTrainer(spec, hf_config, hf_tensors, tp_group=group)   # group None = TP 1
    trainer.zero_grads()
    for step in claimed_microsteps:
        trainer.accumulate(step)              # every TP rank of the cell, same micro-step
    <reduce trainer.flat_grads over the cells, per TP rank>
    trainer.optimizer_step()                  # core only

What the base interface means here:

- `flat_params` / `flat_grads` are this TP rank's shard in Megatron's layout (fused QKV, fused
  gate/up), the fastest thing to move: cells share one layout, so a satellite's TP rank r pulls the
  core's rank-r buffer and the reduction runs rank by rank. HF names and full shapes are only needed
  where something outside the trainer reads the weights: `named_weights()` (publication, a collective
  of the TP group) and checkpoints.
- `accumulate` runs `gyre.rl.step_loss.train_microstep` with `model.packed_logits` as the logits
  function (TP logits gathered exactly), then sums the TP-partial q/k-norm gradients.
- `optimizer_step` clips by the TP-global norm, steps torch AdamW, bumps the version. On GPUs with a
  data-parallel group inside the cell, Megatron's DistributedOptimizer is the intended path
  (`distributed_optimizer.py`, untested: no GPU on the machines that built this).
- `ValueError` for a model or layout megatron cannot build, raised before any process group is made.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist

from gyre.rl.microstep import MicroStep
from gyre.rl.step_loss import StepResult, train_microstep
from gyre.trainer.backends.base import TrainerBackend, TrainerSpec
from gyre.trainer.backends.megatron.architecture import (
    GPTArchitecture,
    architecture_from_hf,
    check_parallel_layout,
)
from gyre.trainer.backends.megatron.checkpoint import (
    CONFIG_FILENAME,
    finish_checkpoint,
    optimizer_filename,
    read_checkpoint_info,
    read_hf_directory,
    staging_dir,
    step_dir,
    write_hf_directory,
)
from gyre.trainer.backends.megatron.model import build_gpt_model, packed_logits, uses_transformer_engine
from gyre.trainer.backends.megatron.parameters import FlatShard
from gyre.trainer.backends.megatron.weights import check_hf_tensors, hf_to_megatron, megatron_to_hf
from gyre.trainer.flat import weights_digest

if TYPE_CHECKING:
    from gyre.trainer.backends.megatron.distributed_optimizer import DistributedShard

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def single_rank_group() -> dist.ProcessGroup:
    """A TP group of this process alone; starts a one-process gloo world if none exists yet."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.new_group([dist.get_rank()], use_local_synchronization=True)


class MegatronTrainer(TrainerBackend):
    name: ClassVar[str] = "megatron"

    def __init__(
        self,
        spec: TrainerSpec,
        hf_config: Mapping[str, Any],
        hf_tensors: Mapping[str, torch.Tensor],
        *,
        tp_group: dist.ProcessGroup | None = None,
        version: int | None = 0,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        self.arch: GPTArchitecture = architecture_from_hf(hf_config)
        check_parallel_layout(self.arch, tensor_parallel_size=1 if tp_group is None else tp_group.size())
        check_hf_tensors(self.arch, hf_tensors)
        self.spec = spec
        self.hf_config = dict(hf_config)
        self.device = torch.device(spec.section.device)
        dtype = params_dtype or _DTYPES[spec.section.dtype]
        self.tp_group = tp_group if tp_group is not None else single_rank_group()
        self.tp_rank, self.tp_size = self.tp_group.rank(), self.tp_group.size()
        self.fused_norms = uses_transformer_engine(self.device)
        self.model = build_gpt_model(
            self.arch, tp_group=self.tp_group, device=self.device, params_dtype=dtype
        )
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
        """From the HF directory `model.path` of the config (TP 1; the cell agent passes its TP group
        to the constructor instead)."""
        path = getattr(spec.model_section, "path", None)
        if path is None:
            raise ValueError("model.path: the megatron backend needs an HF model directory")
        config, tensors = read_hf_directory(Path(path))
        return cls(spec, config, tensors, version=0)

    def _shard_of(self, hf_tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return hf_to_megatron(
            self.arch, hf_tensors, tp_rank=self.tp_rank, tp_size=self.tp_size, fused_norms=self.fused_norms
        )

    @property
    def config(self) -> dict[str, Any]:  # type: ignore[override]
        """The HF config.json of the weights (what published directories and engines must match)."""
        return self.hf_config

    @property
    def flat_params(self) -> torch.Tensor:
        return self.store.params

    @property
    def flat_grads(self) -> torch.Tensor:
        return self.store.grads

    def zero_grads(self) -> None:
        self.store.zero_grads()

    def _logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        return packed_logits(self.model, input_ids, position_ids, cu_seqlens)

    def accumulate(self, step: MicroStep) -> StepResult:
        before = self.store.partial_grads()
        result = train_microstep(
            step,
            self._logits,
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
        return megatron_to_hf(self.arch, self._gathered_shards(), fused_norms=self.fused_norms)

    def load_weights(self, tensors: Mapping[str, torch.Tensor], version: int | None) -> None:
        """HF-named full tensors in; each TP rank keeps its shard."""
        self.store.load_named(self._shard_of(tensors))
        self.version = version

    def save_checkpoint(self, directory: Path) -> Path:
        """Collective over the TP group: rank 0 writes the HF weights, every rank its optimizer shard."""
        if self.version is None:
            raise RuntimeError("cannot checkpoint weights of unknown version")
        weights = self.named_weights()
        staging = staging_dir(directory, self.version)
        if self.tp_rank == 0:
            shutil.rmtree(staging, ignore_errors=True)  # a partial copy left by a crash
            write_hf_directory(staging, self.hf_config, weights)
        self._barrier()
        state = self.store.optimizer_state()
        if state is not None:
            torch.save(state, staging / optimizer_filename(self.tp_rank, self.tp_size))
        self._barrier()
        if self.tp_rank == 0:
            finish_checkpoint(
                directory, self.version, tp_size=self.tp_size, keep=self.spec.section.keep_checkpoints
            )
        self._barrier()
        return step_dir(directory, self.version)

    def load_checkpoint(self, path: Path) -> None:
        info = read_checkpoint_info(path)
        config = json.loads((Path(path) / CONFIG_FILENAME).read_text())
        if architecture_from_hf(config) != self.arch:
            raise ValueError(f"checkpoint {path} has another architecture than this trainer's model")
        _, tensors = read_hf_directory(Path(path))
        self.store.load_named(self._shard_of(tensors))
        optimizer_path = Path(path) / optimizer_filename(self.tp_rank, self.tp_size)
        if self.store.optimizer is not None:
            if int(info["tensor_parallel_size"]) != self.tp_size or not optimizer_path.is_file():
                raise ValueError(
                    f"checkpoint {path} has no optimizer shard for TP rank {self.tp_rank} of {self.tp_size} "
                    f"(written with tensor_parallel_size {info['tensor_parallel_size']})"
                )
            self.store.load_optimizer_state(torch.load(optimizer_path, weights_only=True))
        self.version = int(info["policy_version"])

    def digest(self) -> str:
        """SHA-256 of this TP rank's shard (`flat_params`)."""
        return weights_digest(self.store.params)

    def _barrier(self) -> None:
        if self.tp_size > 1:
            dist.barrier(group=self.tp_group)
