"""Gyre's CPU `sgl_kernel` shim (deploy/sglang/cpu_kernel_shim) against each function's contract; the real
SGLang runs on it in tests/integration/test_engine_backends.py. Loaded from its file: it is installed only
into `.venv-sglang`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

SHIM = (
    Path(__file__).resolve().parents[3]
    / "deploy"
    / "sglang"
    / "cpu_kernel_shim"
    / "sgl_kernel"
    / "__init__.py"
)


def _shim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gyre_sgl_kernel_shim", SHIM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_assign_req_to_token_pool_writes_each_requests_new_slots() -> None:
    table = torch.zeros(4, 10, dtype=torch.int32)
    _shim().assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]),
        table,
        torch.tensor([1, 0]),
        torch.tensor([3, 4]),
        torch.tensor([10, 11, 12, 13, 14, 15]),
        10,
    )
    assert table[2, :4].tolist() == [0, 10, 11, 0]
    assert table[0, :5].tolist() == [12, 13, 14, 15, 0]
    assert int(table[1].abs().sum()) == 0 and int(table[3].abs().sum()) == 0


def test_copy_all_layer_kv_cache_copies_slots_in_every_buffer_overlap_safe() -> None:
    k = torch.arange(48, dtype=torch.float32).view(8, 6)
    v = torch.arange(100, 116, dtype=torch.bfloat16).view(8, 2)
    expected_k, expected_v = k.clone(), v.clone()
    expected_k[[0, 1, 5]] = k[[1, 0, 7]].clone()
    expected_v[[0, 1, 5]] = v[[1, 0, 7]].clone()
    ptrs = torch.tensor([k.data_ptr(), v.data_ptr()], dtype=torch.int64)
    strides = torch.tensor(
        [k.stride(0) * k.element_size(), v.stride(0) * v.element_size()], dtype=torch.int64
    )
    _shim().copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([0, 1, 5]), torch.tensor([1, 0, 7]))
    assert torch.equal(k, expected_k) and torch.equal(v, expected_v)


def test_a_kernel_the_shim_lacks_fails_with_one_line_naming_it() -> None:
    with pytest.raises(NotImplementedError) as e:
        _shim().verify_tree_greedy_cpu()
    assert "sgl_kernel.verify_tree_greedy_cpu is not in Gyre's CPU shim" in str(e.value)
    assert "\n" not in str(e.value)
