"""Parameters and gradients of a module as views of two contiguous buffers.

Why: the whole weight set then is one tensor at one address. A satellite pulls it with one Mooncake
read of one registered buffer, the core broadcasts it with one collective, and the gradient
reduction of a step is one `reduce` of one tensor. Megatron's DDP keeps its parameters and gradients
in flat buffers for the same reasons.

    flat = FlatParameters(model)             # model.parameters() now live inside flat.params
    loss.backward()                          # autograd accumulates into flat.grads in place
    dist.reduce(flat.grads, dst=0)
    flat.digest()                            # SHA-256 of the weight bytes

Autograd accumulates into an existing `.grad` in place, so the views survive backward passes;
optimizers update `p.data` in place, so the parameter views survive optimizer steps. Nothing may
assign `p.grad = None` (e.g. `optimizer.zero_grad()` with its default `set_to_none=True`): zero
`flat.grads` instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn


def weights_digest(buffer: torch.Tensor) -> str:
    """SHA-256 (hex) of the raw bytes of a contiguous tensor (on the host; a device tensor is copied)."""
    if not buffer.is_contiguous():
        raise ValueError("weights_digest needs a contiguous tensor")
    host = buffer.detach()
    if host.device.type != "cpu":
        host = host.cpu()
    return hashlib.sha256(host.view(torch.uint8).numpy().data).hexdigest()


@dataclass(frozen=True, slots=True)
class FlatSlot:
    """Where one named parameter lives in the flat buffers."""

    offset: int
    numel: int
    shape: tuple[int, ...]


class FlatParameters:
    """Re-homes every parameter of `module` (in `named_parameters()` order, or the `named` subset it is
    given: a LoRA adapter's matrices under their PEFT names) into `params`, and its gradient into
    `grads`; both buffers have the parameters' dtype and device."""

    def __init__(self, module: nn.Module, named: Sequence[tuple[str, nn.Parameter]] | None = None) -> None:
        named = list(module.named_parameters()) if named is None else list(named)
        if not named:
            raise ValueError("the module has no parameters")
        dtypes = {p.dtype for _, p in named}
        devices = {p.device for _, p in named}
        if len(dtypes) != 1 or len(devices) != 1:
            raise ValueError(f"all parameters must share one dtype and device; got {dtypes} on {devices}")
        dtype, device = dtypes.pop(), devices.pop()
        total = sum(p.numel() for _, p in named)
        self.params = torch.empty(total, dtype=dtype, device=device)
        self.grads = torch.zeros(total, dtype=dtype, device=device)
        self.slots: dict[str, FlatSlot] = {}
        offset = 0
        with torch.no_grad():
            for name, p in named:
                n = p.numel()
                self.params[offset : offset + n].copy_(p.detach().reshape(-1))
                p.data = self.params[offset : offset + n].view_as(p)
                p.grad = self.grads[offset : offset + n].view_as(p)
                self.slots[name] = FlatSlot(offset, n, tuple(p.shape))
                offset += n
        self._named = named

    @property
    def numel(self) -> int:
        return int(self.params.numel())

    @property
    def nbytes(self) -> int:
        return self.numel * self.params.element_size()

    def zero_grads(self) -> None:
        self.grads.zero_()

    def check_views(self) -> None:
        """Assert every parameter and gradient still lives inside the flat buffers."""
        for name, p in self._named:
            slot = self.slots[name]
            base = self.params.data_ptr() + slot.offset * self.params.element_size()
            assert p.data_ptr() == base, f"parameter {name} left the flat buffer"
            assert p.grad is not None and p.grad.data_ptr() == (
                self.grads.data_ptr() + slot.offset * self.grads.element_size()
            ), f"gradient of {name} left the flat buffer (was .grad set to None?)"

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """name → a view of the parameter in the flat buffer (shaped like the parameter)."""
        return {
            name: self.params[s.offset : s.offset + s.numel].view(s.shape) for name, s in self.slots.items()
        }

    def load_named(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy every named parameter in (strict: same names, same shapes)."""
        missing = sorted(set(self.slots) - set(tensors))
        unexpected = sorted(set(tensors) - set(self.slots))
        if missing or unexpected:
            raise ValueError(
                f"weights do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
        with torch.no_grad():
            for name, s in self.slots.items():
                t = tensors[name]
                if tuple(t.shape) != s.shape:
                    raise ValueError(f"parameter {name!r} has shape {tuple(t.shape)}, expected {s.shape}")
                self.params[s.offset : s.offset + s.numel].copy_(t.reshape(-1))

    def digest(self) -> str:
        return weights_digest(self.params)
