"""The `sgl_kernel` functions SGLang's CPU path (`--device cpu`) calls, in plain torch.

SGLang imports two functions from its kernel package on CPU (KV-cache moves and request-to-token
bookkeeping) and looks up a few speculative-decoding names at import time; PyPI publishes no CPU build
of that package. This module implements the two from their contracts and defines the looked-up names as
functions that raise one line naming themselves, so a path that needs a kernel Gyre lacks (speculative
decoding, the fused AMX kernels under `torch.ops.sgl_kernel`) fails clearly instead of computing wrong.

Installed by `make setup` into `.venv-sglang` only where the real package does not import; check with

    .venv-sglang/bin/python -c "import sgl_kernel; print(sgl_kernel.__file__)"
"""

from __future__ import annotations

import ctypes
from typing import Any, NoReturn

import torch

IS_GYRE_CPU_SHIM = True
"""Marks this module as Gyre's shim (the real package has no such attribute)."""


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """For request i of the batch: `req_to_token[req_pool_indices[i], start[i]:end[i]]` = the next
    `end[i] - start[i]` entries of `out_cache_loc` (the requests' new slots, laid out back to back)."""
    assert req_to_token.shape[1] == pool_len, (req_to_token.shape, pool_len)
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    offset = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        n = end - start
        if n > 0:
            req_to_token[row, start:end] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every KV buffer b (its address `data_ptrs[b]`, `strides[b]` bytes a slot): copy the slots
    `src_loc` onto the slots `tgt_loc`, all sources read before any target is written (overlap-safe)."""
    if tgt_loc.numel() == 0:
        return
    assert tgt_loc.numel() == src_loc.numel(), (tgt_loc.shape, src_loc.shape)
    tgt = tgt_loc.to(torch.long)
    src = src_loc.to(torch.long)
    num_slots = int(max(int(tgt.max()), int(src.max()))) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (num_slots * stride)).from_address(ptr)
        slots = torch.frombuffer(raw, dtype=torch.uint8).view(num_slots, stride)
        slots[tgt] = slots[src]


def _missing(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not in Gyre's CPU shim (deploy/sglang/cpu_kernel_shim): this SGLang path "
            "needs the real kernel package (a GPU node)"
        )

    kernel.__name__ = name
    return kernel


# Speculative decoding (EAGLE trees, n-gram) on CPU: looked up when SGLang imports, never called without
# --speculative-algorithm.
build_tree_kernel_efficient_cpu = _missing("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _missing("verify_tree_greedy_cpu")
assign_draft_cache_locs_contiguous_cpu = _missing("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _missing("assign_extend_cache_locs_cpu")
fill_accept_out_cache_loc_cpu = _missing("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _missing("fill_bonus_tokens_cpu")
