"""Release a trainer's device memory and take it back, bit-exact: what a GPU cell's role switch does
with the trainer state while its engine serves (DESIGN: "cell offloads engine weights/KV, restores
trainer state").

The tensors are a backend's `state_tensors()` (parameters, gradients, optimizer state). Their storages
are copied to host memory (pinned for CUDA) and resized to zero bytes, which frees the device memory
while every view keeps pointing at its storage; `restore` reallocates the storages and copies the bytes
back, so the trainer's tensors, views and flat buffers are the same objects afterwards. Addresses do
change: a transport that registered a buffer (Mooncake) must register it again after a restore. A CPU
storage that numpy has shared (`weights_digest` of CPU weights does) can no longer be resized, and is
refused: offloading is for device memory.

    offload = StateOffload(trainer.state_tensors())
    offload.release()          # torch.cuda.memory_allocated() drops by offload.nbytes
    offload.restore()          # same bytes, same tensor objects
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _bytes_view(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


class StateOffload:
    """The storages of some tensors, releasable and restorable (each storage once, however many views)."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        seen: dict[int, tuple[torch.UntypedStorage, torch.device]] = {}
        for t in tensors:
            storage = t.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen[storage.data_ptr()] = (storage, t.device)
        self._storages = list(seen.values())
        self._host: list[torch.Tensor] | None = None
        self.nbytes = sum(s.nbytes() for s, _ in self._storages)

    @property
    def released(self) -> bool:
        return self._host is not None

    def release(self) -> None:
        """Copy every storage to the host and free its device memory."""
        if self._host is not None:
            return
        fixed = [s.nbytes() for s, _ in self._storages if not s.resizable()]
        if fixed:
            raise ValueError(
                f"{len(fixed)} storages ({sum(fixed)} bytes) cannot be resized: a numpy array has shared them "
                "(e.g. a host-side digest of CPU weights); offloading is for device memory"
            )
        host: list[torch.Tensor] = []
        for storage, device in self._storages:
            data = _bytes_view(storage, device)
            copy = torch.empty(data.numel(), dtype=torch.uint8, pin_memory=device.type == "cuda")
            copy.copy_(data)
            host.append(copy)
        if any(d.type == "cuda" for _, d in self._storages):
            torch.cuda.synchronize()
        for storage, _ in self._storages:
            storage.resize_(0)
        self._host = host

    def restore(self) -> None:
        """Reallocate every storage on its device and copy its bytes back."""
        if self._host is None:
            return
        for (storage, device), copy in zip(self._storages, self._host, strict=True):
            storage.resize_(copy.numel())
            _bytes_view(storage, device).copy_(copy, non_blocking=device.type == "cuda")
        if any(d.type == "cuda" for _, d in self._storages):
            torch.cuda.synchronize()
        self._host = None


def optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The state tensors of a torch optimizer (AdamW's exp_avg, exp_avg_sq, step), for `state_tensors`."""
    if optimizer is None:
        return []
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
