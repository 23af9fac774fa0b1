import dataclasses

import numpy as np
import pytest

from gyre.rl.microstep import row_chunks
from gyre.rl.packing import pack
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
