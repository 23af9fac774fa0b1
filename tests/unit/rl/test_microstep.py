import dataclasses

import numpy as np
import pytest

from gyre.model.tree_layout import TreeLayout
from gyre.rl.microstep import path_positions, row_chunks
from gyre.rl.packing import pack
from tests.unit.rl.helpers import simulated_rows
from tests.unit.rl.test_packing import random_rows


@pytest.fixture
def step():
    rows, advantages = random_rows(11, 4)
    (only,) = pack(rows, advantages, num_batch_executions=8, token_budget=10_000)
    assert only.num_executions == 4
    return only


def test_properties(step):
    assert step.num_tokens == int(step.cu_seqlens[-1])
    assert step.num_rows == len(step.row_lengths) == len(step.row_execution)
    assert step.num_targets == int(step.execution_num_targets.sum())
    assert not step.oversize


def broken(step, **changes):
    with pytest.raises(ValueError):
        dataclasses.replace(step, **changes)


def test_row_boundaries_are_checked(step):
    cu = step.cu_seqlens.copy()
    cu[-1] += 1
    broken(step, cu_seqlens=cu)
    cu = step.cu_seqlens.copy()
    cu[1] = cu[0]
    broken(step, cu_seqlens=cu)


def test_per_token_arrays_must_cover_every_token(step):
    broken(step, coefficients=step.coefficients[:-1])
    broken(step, position_ids=step.position_ids[1:])


def test_first_token_of_a_row_is_never_a_target(step):
    mask = step.target_mask.copy()
    mask[step.cu_seqlens[1]] = True
    broken(step, target_mask=mask)


def test_execution_index_is_constant_inside_a_row(step):
    index = step.execution_index.copy()
    index[step.cu_seqlens[1] - 1] = (index[step.cu_seqlens[1] - 1] + 1) % step.num_executions
    broken(step, execution_index=index)


def test_execution_index_stays_in_range(step):
    broken(step, execution_index=np.full_like(step.execution_index, step.num_executions))


def test_target_counts_must_match(step):
    counts = step.execution_num_targets.copy()
    counts[0] += 1
    broken(step, execution_num_targets=counts)


def test_execution_ids_are_distinct(step):
    broken(step, execution_ids=(step.execution_ids[0],) * step.num_executions)
    broken(step, advantages=step.advantages[:-1])


def test_row_chunks():
    cu = np.array([0, 5, 10, 15, 40, 42])
    assert row_chunks(cu, 10) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert row_chunks(cu, 100) == [(0, 5)]
    assert row_chunks(np.array([0]), 10) == []
    with pytest.raises(ValueError):
        row_chunks(cu, 0)


@pytest.fixture
def tree_step():
    rows, advantages = simulated_rows("tree")
    (only,) = pack(rows, advantages, num_batch_executions=8, token_budget=10**6)
    assert only.tree is not None and not only.tree.is_paths
    return only


def test_positions_are_checked_against_each_path(step, tree_step):
    broken(step, position_ids=np.arange(step.num_tokens, dtype=np.int32))
    broken(tree_step, position_ids=path_positions(tree_step.cu_seqlens, None))
    broken(tree_step, tree=None)  # tree positions without their layout


def test_the_tree_layout_must_describe_the_rows(tree_step):
    shifted = TreeLayout.concat([TreeLayout.path_rows([1]), tree_step.tree.rows(1, tree_step.num_rows)])
    broken(tree_step, tree=shifted)


def test_as_path_rows_expands_each_leaf_and_keeps_every_target_once(tree_step):
    paths = tree_step.as_path_rows()
    assert paths.tree is None
    assert paths.num_rows == int(tree_step.tree.num_leaves().sum()) > tree_step.num_rows
    assert paths.num_tokens > tree_step.num_tokens
    assert np.array_equal(paths.execution_num_targets, tree_step.execution_num_targets)
    assert np.isclose(paths.coefficients.sum(), tree_step.coefficients.sum())
    assert sorted(paths.behaviour_logprobs[paths.target_mask]) == sorted(
        tree_step.behaviour_logprobs[tree_step.target_mask]
    )
    assert paths.as_path_rows() is paths
