"""The GPU path of the megatron backend's parameters: Megatron's DDP buffers and DistributedOptimizer.

UNTESTED: written against megatron-core 0.16.1's source on machines without a GPU (its DDP and
DistributedOptimizer allocate on CUDA, so nothing of this runs on CPU). It has the interface of
`parameters.FlatShard`, so the trainer uses one or the other:

- Megatron's `DistributedDataParallel` re-homes this rank's parameters into one contiguous buffer
  (`param_data`, bf16) and accumulates gradients into another (`grad_data`, fp32 via `main_grad`): they
  are `params` / `grads`, the buffers a snapshot reads and the cells' reduction runs over.
- The data-parallel group inside the cell is this rank alone (a cell's GPUs are its TP group; the
  data parallelism across cells is Gyre's own reduction to the core), so DDP's own gradient sync is a
  no-op and the distributed optimizer keeps fp32 master weights and Adam state for the whole shard.
- `DistributedOptimizer.step()` clips by the TP-global norm (Megatron's rule is torch's:
  max_norm / (norm + 1e-6), applied when < 1) and copies the updated fp32 master weights back into
  the bf16 buffer.

    store = DistributedShard(model, tp_group, section, with_optimizer=True)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from torch import Tensor

from gyre.config.training import TrainerSection
from gyre.trainer.backends.megatron.model import GyreGPTModel
from gyre.trainer.backends.megatron.parameters import is_tp_partial
from gyre.trainer.offload import optimizer_tensors


class DistributedShard:
    """Megatron DDP buffers of this rank's shard, with the DistributedOptimizer when `with_optimizer`."""

    def __init__(
        self,
        model: GyreGPTModel,
        tp_group: dist.ProcessGroup,
        section: TrainerSection,
        *,
        with_optimizer: bool,
    ) -> None:
        groups = model.pg_collection
        alone = groups.dp
        for name in ("expt_dp", "intra_dist_opt", "ep", "expt_tp"):
            setattr(groups, name, alone)
        groups.tp_ep_pp = tp_group
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True
        )
        self.ddp = DistributedDataParallel(model.config, ddp_config, model, pg_collection=groups)
        if len(self.ddp.buffers) != 1:
            raise ValueError(
                f"expected one DDP parameter buffer (one dtype, no experts); got {len(self.ddp.buffers)}"
            )
        self.model = model
        self.tp_group = tp_group
        self.named = dict(model.named_parameters())
        self.partial = [n for n in self.named if is_tp_partial(n)] if tp_group.size() > 1 else []
        self.optimizer = None
        if with_optimizer:
            config = OptimizerConfig(
                optimizer="adam",
                lr=section.lr,
                weight_decay=section.weight_decay,
                adam_beta1=section.adam_beta1,
                adam_beta2=section.adam_beta2,
                adam_eps=section.adam_eps,
                clip_grad=section.grad_clip,
                bf16=model.config.bf16,
                params_dtype=model.config.params_dtype,
                use_distributed_optimizer=True,
            )
            self.optimizer = get_megatron_optimizer(
                config, [self.ddp], use_gloo_process_groups=False, pg_collection=groups
            )

    @property
    def params(self) -> Tensor:
        return self.ddp.buffers[0].param_data

    @property
    def grads(self) -> Tensor:
        return self.ddp.buffers[0].grad_data

    def zero_grads(self) -> None:
        self.ddp.zero_grad_buffer()

    def partial_grads(self) -> list[Tensor]:
        return [self.named[n].main_grad.clone() for n in self.partial]

    def sum_partial_grads(self, before: list[Tensor]) -> None:
        if not self.partial:
            return
        deltas = torch.cat(
            [(self.named[n].main_grad - b).reshape(-1) for n, b in zip(self.partial, before, strict=True)]
        )
        dist.all_reduce(deltas, op=dist.ReduceOp.SUM, group=self.tp_group)
        offset = 0
        for n, b in zip(self.partial, before, strict=True):
            g = self.named[n].main_grad
            g.copy_(b + deltas[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def step(self, grad_clip: float) -> float:
        if self.optimizer is None:
            raise RuntimeError("this trainer has no optimizer: only the core takes optimizer steps")
        if grad_clip != self.optimizer.config.clip_grad:
            raise ValueError("the distributed optimizer clips with the grad_clip it was built with")
        self.ddp.finish_grad_sync()
        ok, norm, _ = self.optimizer.step()
        if not ok:
            raise RuntimeError("the distributed optimizer skipped its step (non-finite gradients)")
        self.ddp.zero_grad_buffer()
        return float(norm)

    def named_tensors(self) -> dict[str, Tensor]:
        return {n: p.data for n, p in self.named.items()}

    def load_named(self, tensors: dict[str, Tensor]) -> None:
        if set(tensors) != set(self.named):
            raise ValueError("weights do not match the model's parameters")
        with torch.no_grad():
            for n, p in self.named.items():
                p.data.copy_(tensors[n])
        if self.optimizer is not None:
            self.optimizer.reload_model_params()  # the fp32 master weights follow

    def state_tensors(self) -> list[Tensor]:
        """DDP's parameter and gradient buffers, the fp32 master shards and the inner Adam state."""
        tensors = [self.params, self.grads]
        if self.optimizer is not None:
            for group in getattr(self.optimizer, "shard_fp32_from_float16_groups", []):
                tensors.extend(group)
            tensors.extend(optimizer_tensors(self.optimizer.optimizer))
        return tensors

    def optimizer_state(self) -> dict[str, Any] | None:
        if self.optimizer is None:
            return None
        return {
            "optimizer": self.optimizer.state_dict(),
            "params": self.optimizer.get_parameter_state_dp_reshardable(),
        }

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.optimizer.load_parameter_state_from_dp_reshardable(state["params"])
