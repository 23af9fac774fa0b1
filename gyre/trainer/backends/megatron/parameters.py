"""The parameters, gradients and core optimizer of one TP rank's Megatron shard, on CPU (and on GPUs
without the distributed optimizer): flat buffers, torch AdamW, a TP-aware global-norm clip.

Why flat buffers: as in the torch backend (`gyre.trainer.flat`), a snapshot is one read of
`params`, a step's reduction across cells is one collective over `grads`. Each TP rank holds its own
shard, so the cells' reduction runs per TP rank (rank r of every cell together) and a satellite of
the same layout pulls the core's shard of its own rank.

Two TP details the plain torch path does not have:

- the gradient norm of the clip is that of the whole model: Σ over TP ranks of the sharded
  parameters' squares plus the replicated parameters' squares once (`tensor_model_parallel` is
  Megatron's own marker of a sharded parameter);
- Qwen3's q/k RMSNorm weights are replicated but each rank's gradient covers only its own heads:
  `sum_partial_grads` adds them up over the TP group after every micro-step (Megatron's
  `finalize_model_grads` does the same for `qk_layernorm`).

    store = FlatShard(model, tp_group, section, with_optimizer=True)
    before = store.partial_grads()
    ... backward ...
    store.sum_partial_grads(before)
    norm = store.step(grad_clip=1.0)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gyre.config.training import TrainerSection
from gyre.trainer.flat import FlatParameters
from gyre.trainer.offload import optimizer_tensors
from gyre.trainer.optimizer import CLIP_EPS, build_adamw


def is_tp_partial(name: str) -> bool:
    """Replicated parameters whose gradient each TP rank computes only in part (Qwen3's q/k norms)."""
    return name.endswith(("q_layernorm.weight", "k_layernorm.weight"))


class FlatShard:
    """Flat parameter/gradient buffers of this rank's shard, and AdamW over them when `with_optimizer`."""

    def __init__(
        self, model: nn.Module, tp_group: dist.ProcessGroup, section: TrainerSection, *, with_optimizer: bool
    ) -> None:
        self.model = model
        self.tp_group = tp_group
        self.flat = FlatParameters(model)
        named = dict(model.named_parameters())
        self.sharded = [n for n, p in named.items() if getattr(p, "tensor_model_parallel", False)]
        self.replicated = [n for n in named if n not in set(self.sharded)]
        self.partial = [n for n in named if is_tp_partial(n)] if tp_group.size() > 1 else []
        self.optimizer = build_adamw(model.parameters(), section) if with_optimizer else None

    @property
    def params(self) -> Tensor:
        return self.flat.params

    @property
    def grads(self) -> Tensor:
        return self.flat.grads

    def _grad(self, name: str) -> Tensor:
        s = self.flat.slots[name]
        return self.flat.grads[s.offset : s.offset + s.numel]

    def zero_grads(self) -> None:
        self.flat.zero_grads()

    def partial_grads(self) -> list[Tensor]:
        """Copies of the TP-partial gradients before a backward (see `sum_partial_grads`)."""
        return [self._grad(n).clone() for n in self.partial]

    def sum_partial_grads(self, before: list[Tensor]) -> None:
        """Replace this micro-step's contribution to each TP-partial gradient by its sum over the group."""
        if not self.partial:
            return
        deltas = torch.cat([self._grad(n) - b for n, b in zip(self.partial, before, strict=True)])
        dist.all_reduce(deltas, op=dist.ReduceOp.SUM, group=self.tp_group)
        offset = 0
        for n, b in zip(self.partial, before, strict=True):
            g = self._grad(n)
            g.copy_(b + deltas[offset : offset + g.numel()])
            offset += g.numel()

    def grad_norm(self) -> float:
        """L2 norm of the whole model's gradient (all TP shards, replicated parameters once)."""
        sharded = sum(
            (self._grad(n).double().square().sum() for n in self.sharded),
            torch.zeros((), dtype=torch.float64),
        )
        if self.tp_group.size() > 1:
            dist.all_reduce(sharded, op=dist.ReduceOp.SUM, group=self.tp_group)
        replicated = sum(
            (self._grad(n).double().square().sum() for n in self.replicated),
            torch.zeros((), dtype=torch.float64),
        )
        return float((sharded + replicated).sqrt())

    def step(self, grad_clip: float) -> float:
        """Clip by the global norm (torch's rule, 0 = off), one AdamW step, zero the gradients."""
        if self.optimizer is None:
            raise RuntimeError("this trainer has no optimizer: only the core takes optimizer steps")
        norm = self.grad_norm()
        if grad_clip > 0:
            self.flat.grads.mul_(min(1.0, grad_clip / (norm + CLIP_EPS)))
        self.optimizer.step()
        self.flat.zero_grads()
        self.flat.check_views()
        return norm

    def named_tensors(self) -> dict[str, Tensor]:
        return self.flat.named_tensors()

    def load_named(self, tensors: dict[str, Tensor]) -> None:
        self.flat.load_named(tensors)

    def state_tensors(self) -> list[Tensor]:
        return [self.flat.params, self.flat.grads, *optimizer_tensors(self.optimizer)]

    def optimizer_state(self) -> dict[str, Any] | None:
        return None if self.optimizer is None else self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state)
