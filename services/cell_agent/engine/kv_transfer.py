"""The wire format of KV migration: one safetensors blob per pinned request.

Transport is plain HTTP between engines (`/gyre/kv/export` → bytes → `/gyre/kv/import`), not the
Mooncake Transfer Engine. Why: the embedded model's KV is ~4 KiB per token (a 4k-token context is
16 MiB), loopback HTTP moves that in milliseconds, the same endpoints work between hosts, and the
engine stays free of a native dependency and of Mooncake's 0.0.0.0 listener. On GPU clusters the KV
of a real SGLang engine moves through SGLang's own disaggregation transfer (Mooncake over RDMA), which
is SGLang's business, not this format's.

Tensors: `k`, `v` of shape [num_layers, num_tokens, num_heads, head_dim] (keys after rotary).
Metadata (strings): `format`, `token_ids` (JSON), `weight_version`, `fingerprint` (the model
architecture; KV moves only between equal fingerprints and equal weight versions), `adapter` (the
LoRA adapter's name, empty for the base model: it moves only to an engine serving that name).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from services.cell_agent.engine.sources.base import OutputSourceError

FORMAT = "gyre-kv/1"


@dataclass(frozen=True, slots=True)
class KVPayload:
    token_ids: tuple[int, ...]
    weight_version: str
    fingerprint: str
    k: torch.Tensor
    v: torch.Tensor
    adapter: str = ""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def encode_kv(payload: KVPayload) -> bytes:
    assert payload.k.shape == payload.v.shape
    assert payload.k.dim() == 1 or payload.k.shape[1] == payload.num_tokens
    metadata = {
        "format": FORMAT,
        "token_ids": json.dumps(list(payload.token_ids)),
        "weight_version": payload.weight_version,
        "fingerprint": payload.fingerprint,
        "adapter": payload.adapter,
    }
    return st_save({"k": payload.k.contiguous(), "v": payload.v.contiguous()}, metadata=metadata)


def _metadata(blob: bytes) -> dict[str, str]:
    if len(blob) < 8:
        raise OutputSourceError("KV payload is truncated")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > len(blob) - 8:
        raise OutputSourceError("KV payload header is truncated")
    try:
        header = json.loads(blob[8 : 8 + header_len])
    except ValueError as e:
        raise OutputSourceError(f"KV payload header is not JSON: {e}") from e
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise OutputSourceError("KV payload metadata is not an object")
    return {str(k): str(v) for k, v in meta.items()}


def decode_kv(blob: bytes) -> KVPayload:
    meta = _metadata(blob)
    if meta.get("format") != FORMAT:
        raise OutputSourceError(f"KV payload format is {meta.get('format')!r}; expected {FORMAT!r}")
    try:
        tensors = st_load(blob)
        token_ids = tuple(int(t) for t in json.loads(meta["token_ids"]))
        k, v = tensors["k"], tensors["v"]
    except (KeyError, ValueError, TypeError) as e:
        raise OutputSourceError(f"KV payload is malformed: {e}") from e
    if k.shape != v.shape or (k.dim() == 4 and k.shape[1] != len(token_ids)):
        raise OutputSourceError(
            f"KV payload shapes {tuple(k.shape)} / {tuple(v.shape)} do not match {len(token_ids)} tokens"
        )
    return KVPayload(
        token_ids=token_ids,
        weight_version=meta.get("weight_version", ""),
        fingerprint=meta.get("fingerprint", ""),
        k=k,
        v=v,
        adapter=meta.get("adapter", ""),
    )
