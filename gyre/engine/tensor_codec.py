"""Encoding named tensors for `/update_weights_from_tensor`, for the embedded engine and for SGLang.

- `safetensors` (the embedded engine): base64 of a safetensors file; portable, no pickle, works
  across processes and hosts.
- `sglang` (a real SGLang server): what SGLang's `MultiprocessingSerializer.serialize(..., output_str
  =True)` produces, base64 of a torch `ForkingPickler` dump of `[(name, tensor), ...]`. Storages
  travel as shared-memory or CUDA-IPC handles, so this only works for a trainer on the same host as
  the server and while the sending process keeps the tensors alive (SGLang's colocated weight sync):
  the caller holds `keep` until the server has answered. CPU tensors are copied into named shared
  memory (torch's `file_system` sharing): the default `file_descriptor` sharing hands a descriptor
  over multiprocessing's resource sharer, whose authentication key only processes spawned by the
  sender hold, and a server the cell agent launched refuses it (measured: `AuthenticationError`,
  then the server's scheduler died).

Either way the request carries one string per tensor-parallel rank of the server.
"""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing  # registers torch's ForkingPickler reductions
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

_SHARING = threading.Lock()  # the sharing strategy is process-wide: one encoder at a time sets it
SAFETENSORS = "safetensors"
SGLANG = "sglang"


def encode_safetensors_b64(named_tensors: Mapping[str, torch.Tensor]) -> str:
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in named_tensors.items()}
    return base64.b64encode(st_save(tensors)).decode("ascii")


def decode_safetensors_b64(text: str) -> dict[str, torch.Tensor]:
    return dict(st_load(base64.b64decode(text)))


def encode_sglang_b64(named_tensors: Mapping[str, torch.Tensor], keep: list[torch.Tensor]) -> str:
    """SGLang's MultiprocessingSerializer format (see the module docstring for its limits); the shared
    copies are appended to `keep`, which the caller holds until the server has read them."""
    shared = [
        (name, t.detach().clone() if t.device.type == "cpu" else t.detach())
        for name, t in named_tensors.items()
    ]
    keep.extend(t for _, t in shared)
    buf = io.BytesIO()
    previous = torch.multiprocessing.get_sharing_strategy()
    with _SHARING:
        torch.multiprocessing.set_sharing_strategy("file_system")
        try:
            ForkingPickler(buf).dump(shared)
        finally:
            torch.multiprocessing.set_sharing_strategy(previous)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def update_weights_payload(
    named_tensors: Mapping[str, torch.Tensor],
    *,
    encoding: str,
    tp_size: int = 1,
    weight_version: str | None = None,
    flush_cache: bool = True,
    abort_all_requests: bool = False,
    keep: list[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """The JSON body of `/update_weights_from_tensor` (SGLang's UpdateWeightsFromTensorReqInput); the
    `sglang` encoding needs `keep` (see `encode_sglang_b64`)."""
    if encoding == SAFETENSORS:
        serialized, load_format = encode_safetensors_b64(named_tensors), SAFETENSORS
    elif encoding == SGLANG:
        if keep is None:
            raise ValueError(
                "the sglang encoding shares memory: pass `keep` and hold it until the server answers"
            )
        serialized, load_format = encode_sglang_b64(named_tensors, keep), None
    else:
        raise ValueError(f"unknown tensor encoding {encoding!r}; expected {SAFETENSORS!r} or {SGLANG!r}")
    return {
        "serialized_named_tensors": [serialized] * tp_size,
        "load_format": load_format,
        "flush_cache": flush_cache,
        "abort_all_requests": abort_all_requests,
        "weight_version": weight_version,
    }
