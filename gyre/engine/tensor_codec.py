"""Encoding named tensors for `/update_weights_from_tensor`, for the embedded engine and for SGLang.

- `safetensors` (the embedded engine): base64 of a safetensors file; portable, no pickle, works
  across processes and hosts.
- `sglang` (a real SGLang server): what SGLang's `MultiprocessingSerializer.serialize(..., output_str
  =True)` produces, base64 of a torch `ForkingPickler` dump of `[(name, tensor), ...]`. Storages
  travel as shared-memory or CUDA-IPC handles, so this only works for a trainer on the same host as
  the server and while the sending process keeps the tensors alive (SGLang's colocated weight sync).

Either way the request carries one string per tensor-parallel rank of the server.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing  # registers torch's ForkingPickler reductions
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

SAFETENSORS = "safetensors"
SGLANG = "sglang"


def encode_safetensors_b64(named_tensors: Mapping[str, torch.Tensor]) -> str:
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in named_tensors.items()}
    return base64.b64encode(st_save(tensors)).decode("ascii")


def decode_safetensors_b64(text: str) -> dict[str, torch.Tensor]:
    return dict(st_load(base64.b64decode(text)))


def encode_sglang_b64(named_tensors: Mapping[str, torch.Tensor]) -> str:
    """SGLang's MultiprocessingSerializer format (see the module docstring for its limits)."""
    buf = io.BytesIO()
    ForkingPickler(buf).dump([(name, t.detach()) for name, t in named_tensors.items()])
    return base64.b64encode(buf.getvalue()).decode("ascii")


def update_weights_payload(
    named_tensors: Mapping[str, torch.Tensor],
    *,
    encoding: str,
    tp_size: int = 1,
    weight_version: str | None = None,
    flush_cache: bool = True,
    abort_all_requests: bool = False,
) -> dict[str, Any]:
    """The JSON body of `/update_weights_from_tensor` (SGLang's UpdateWeightsFromTensorReqInput)."""
    if encoding == SAFETENSORS:
        serialized, load_format = encode_safetensors_b64(named_tensors), SAFETENSORS
    elif encoding == SGLANG:
        serialized, load_format = encode_sglang_b64(named_tensors), None
    else:
        raise ValueError(f"unknown tensor encoding {encoding!r}; expected {SAFETENSORS!r} or {SGLANG!r}")
    return {
        "serialized_named_tensors": [serialized] * tp_size,
        "load_format": load_format,
        "flush_cache": flush_cache,
        "abort_all_requests": abort_all_requests,
        "weight_version": weight_version,
    }
