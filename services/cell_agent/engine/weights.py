"""Decoding the payload of `/update_weights_from_tensor` as the embedded engine accepts it.

SGLang's request is `UpdateWeightsFromTensorReqInput` (managers/io_struct.py):

    {"serialized_named_tensors": [str, ...],   # one per tensor-parallel rank, base64 text
     "load_format": str | null, "flush_cache": true, "abort_all_requests": false,
     "weight_version": str | null}

In SGLang each element is `MultiprocessingSerializer.serialize(named_tensors)`: a torch pickle whose
storages are shared-memory / CUDA-IPC handles, meant for a trainer colocated with the server. The
embedded engine does not unpickle anything it receives over HTTP; it accepts the same envelope with
`load_format: "safetensors"`, where the one element (tp = 1) is base64 of a safetensors file of
name → tensor (`gyre.engine.tensor_codec.encode_safetensors_b64` builds it). Any other load_format
is refused with a message saying so.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from services.cell_agent.engine.protocol import RequestRefused

SAFETENSORS_FORMAT = "safetensors"


def decode_lora_tensors(body: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The adapter matrices of `/load_lora_adapter_from_tensors` (SGLang's `serialized_tensors`, one
    string): accepted as `load_format: "safetensors"`, base64 of a safetensors file of PEFT names."""
    load_format = body.get("load_format")
    if load_format != SAFETENSORS_FORMAT:
        raise RequestRefused(
            f"load_format {load_format!r} is not accepted by the embedded engine: it does not unpickle "
            "tensors sent over HTTP; send load_format='safetensors' with base64 safetensors"
        )
    payload = body.get("serialized_tensors")
    if not isinstance(payload, str) or not payload:
        raise RequestRefused("serialized_tensors must be a base64 string")
    try:
        return dict(st_load(base64.b64decode(payload, validate=True)))
    except (binascii.Error, ValueError, SafetensorError) as e:
        raise RequestRefused(f"serialized_tensors is not base64 safetensors: {e}") from e


def decode_named_tensors(body: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    load_format = body.get("load_format")
    if load_format != SAFETENSORS_FORMAT:
        raise RequestRefused(
            f"load_format {load_format!r} is not accepted by the embedded engine: it does not unpickle "
            "tensors sent over HTTP; send load_format='safetensors' with base64 safetensors "
            "(gyre.engine.EngineClient.update_weights_from_tensor does)"
        )
    payload = body.get("serialized_named_tensors")
    if not isinstance(payload, list) or len(payload) != 1 or not isinstance(payload[0], str):
        raise RequestRefused("serialized_named_tensors must be a list of one base64 string (tp_size is 1)")
    try:
        raw = base64.b64decode(payload[0], validate=True)
        return dict(st_load(raw))
    except (binascii.Error, ValueError, SafetensorError) as e:
        raise RequestRefused(f"serialized_named_tensors[0] is not base64 safetensors: {e}") from e
