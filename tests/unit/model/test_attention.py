import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.model import attention
from gyre.model.attention import (
    block_causal_attention,
    block_causal_mask,
    packed_attention,
    packed_attention_mask,
)
from gyre.model.tree_layout import TreeLayout
from tests.unit.model.test_tree_layout import random_tree


def test_mask_is_block_diagonal_and_causal():
    mask = block_causal_mask(torch.tensor([0, 2, 5], dtype=torch.int32))
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def naive_attention(q, k, v, mask):
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v)


def assert_same_values_and_gradients(out, full, inputs, gen):
    """`out` equals `full` (1e-12), and so do their gradients w.r.t. `inputs` under random weights."""
    assert torch.allclose(out, full, atol=1e-12)
    weights = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    expected = torch.autograd.grad((full * weights).sum(), inputs)
    for got, want in zip(grads, expected, strict=True):
        assert torch.allclose(got, want, atol=1e-12)


def test_attention_equals_masked_softmax_over_the_whole_pack():
    gen = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 3, 4, 9, 16], dtype=torch.int32)
    q, k, v = (torch.randn(16, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    out = block_causal_attention(q, k, v, cu)
    assert torch.allclose(out, naive_attention(q, k, v, block_causal_mask(cu)), atol=1e-12)


def test_each_row_is_computed_as_if_alone():
    gen = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = (torch.randn(12, 4, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    packed = block_causal_attention(q, k, v, cu)
    for a, b in ((0, 5), (5, 12)):
        alone = block_causal_attention(q[a:b], k[a:b], v[a:b], torch.tensor([0, b - a], dtype=torch.int32))
        assert torch.allclose(packed[a:b], alone, atol=1e-12)


def test_grouped_query_attention_repeats_kv_heads():
    gen = torch.Generator().manual_seed(2)
    cu = torch.tensor([0, 4, 7], dtype=torch.int32)
    q = torch.randn(7, 4, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(7, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    out = block_causal_attention(q, k, v, cu)
    full = naive_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), block_causal_mask(cu)
    )
    assert torch.allclose(out, full, atol=1e-12)


def test_gradients_flow_through_every_input():
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    q, k, v = (torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    block_causal_attention(q, k, v, cu).sum().backward()
    assert all(x.grad is not None for x in (q, k, v))


@pytest.mark.parametrize("cu", [[0, 3], [1, 5], [0, 2, 2, 5], []])
def test_bad_boundaries_are_rejected(cu):
    q = torch.zeros(5, 1, 2)
    with pytest.raises(ValueError, match="cu_seqlens"):
        block_causal_attention(q, q, q, torch.tensor(cu, dtype=torch.int32))


def test_bad_shapes_are_rejected():
    q = torch.zeros(4, 3, 2)
    with pytest.raises(ValueError, match="divide"):
        block_causal_attention(q, torch.zeros(4, 2, 2), torch.zeros(4, 2, 2), torch.tensor([0, 4]))
    with pytest.raises(ValueError):
        block_causal_attention(torch.zeros(4, 2), q, q, torch.tensor([0, 4]))


# -- tree rows ------------------------------------------------------------------------------------

# row 0: a path of 4; row 1: root [4,9) → a [9,12) → (c [12,14), d [14,20)); root → b [20,26)
TREE = TreeLayout.concat(
    [TreeLayout.path_rows([4]), TreeLayout.single_row(lengths=[5, 3, 2, 6, 6], parents=[-1, 0, 1, 1, 0])]
)
TREE_CU = TREE.cu_seqlens().tolist()


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_tree_attention_equals_masked_softmax_with_the_ancestor_mask(kv_heads):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(26, 4, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(26, kv_heads, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)
    )
    out = packed_attention(q, k, v, TREE_CU, TREE)
    groups = 4 // kv_heads
    mask = packed_attention_mask(TREE_CU, TREE)
    full = naive_attention(q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), mask)
    assert_same_values_and_gradients(out, full, (q, k, v), gen)


def test_each_path_of_a_tree_row_is_computed_as_if_alone():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(26, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    out = packed_attention(q, k, v, TREE_CU, TREE)
    for chain in TREE.chains():
        path = torch.as_tensor(np.concatenate([chain.context, np.arange(chain.start, chain.end)]))
        alone = packed_attention(q[path], k[path], v[path], [0, len(path)])
        assert torch.allclose(out[chain.start : chain.end], alone[len(chain.context) :], atol=1e-12)


def test_a_layout_of_other_rows_is_rejected():
    q = torch.zeros(26, 1, 2)
    with pytest.raises(ValueError, match="tree layout"):
        packed_attention(q, q, q, [0, 10, 26], TREE)


@settings(max_examples=60, deadline=None)
@given(trees=st.lists(random_tree(), min_size=1, max_size=3), seed=st.integers(0, 99))
def test_tree_attention_and_its_gradient_equal_the_dense_mask_on_random_trees(trees, seed):
    layout = TreeLayout.concat([TreeLayout.single_row(lengths, parents) for lengths, parents in trees])
    cu = layout.cu_seqlens().tolist()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(layout.num_tokens, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    out = packed_attention(q, k, v, cu, layout)
    full = naive_attention(q, k, v, packed_attention_mask(cu, layout))
    assert_same_values_and_gradients(out, full, (q, k, v), gen)


def test_tree_attention_in_bfloat16_stays_within_its_rounding_of_float32():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(26, 4, 8, generator=gen) for _ in range(3))
    want = packed_attention(q, k, v, TREE_CU, TREE)
    got = packed_attention(*(x.bfloat16() for x in (q, k, v)), TREE_CU, TREE)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want, atol=2e-2)


def test_the_masked_fallback_for_other_devices_equals_the_merged_cpu_kernel():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(4, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    context_k, context_v = (
        torch.randn(4, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)
    )
    inputs = (q, context_k, context_v, k, v)
    merged = attention._ContextThenCausal.apply(*(x[None] for x in inputs), None)[0]
    masked = attention._masked_context_attention(*inputs, None)
    assert_same_values_and_gradients(merged, masked, inputs, gen)
