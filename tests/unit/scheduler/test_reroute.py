"""Destination order: the separate pool, then rollout cells in reverse index order."""

import pytest

from services.scheduler.policy import (
    SEPARATE_POOL,
    Role,
    destination_order,
    fill_destinations,
    reroute_destination,
    spread_destinations,
)

R, T, D = Role.ROLLOUT, Role.TRAINING, Role.DRAINING


def test_order_is_pool_then_rollout_cells_from_the_highest_index():
    assert destination_order([R, R, R, R], separate_pool_capacity=10) == [SEPARATE_POOL, 3, 2, 1, 0]
    assert destination_order([T, D, R, R], separate_pool_capacity=0) == [3, 2]


def test_fill_spreads_over_engines_in_order_up_to_free_capacity():
    free = {SEPARATE_POOL: 2, 3: 0, 2: 5, 1: 5}
    assert fill_destinations([SEPARATE_POOL, 3, 2, 1], free.__getitem__, 6) == [(SEPARATE_POOL, 2), (2, 4)]
    assert fill_destinations([SEPARATE_POOL, 3, 2, 1], free.__getitem__, 6, exclude=2) == [
        (SEPARATE_POOL, 2),
        (1, 4),
    ]
    with pytest.raises(ValueError, match="no rollout capacity for 3 of 15"):
        fill_destinations([SEPARATE_POOL, 3, 2, 1], free.__getitem__, 15)


def test_single_reroute_destination_skips_full_engines_and_the_source():
    roles = [T, R, R, R]
    loads = {SEPARATE_POOL: 4, 3: 2, 2: 1, 1: 0}
    kwargs = {"cell_capacity": 2, "separate_pool_capacity": 4}
    assert reroute_destination(roles, loads, source=1, **kwargs) == 2
    assert reroute_destination(roles, loads | {2: 2}, source=1, **kwargs) is None
    assert reroute_destination(roles, loads | {SEPARATE_POOL: 3}, source=1, **kwargs) == SEPARATE_POOL


def test_in_a_changed_pool_the_order_follows_the_members_and_a_full_pool_is_overfilled():
    G = Role.GONE
    # Cell 3 became ready before cell 2: it is the later member, the first choice among cells.
    assert destination_order([R, G, R, R], separate_pool_capacity=0, members=[0, 3, 2]) == [2, 3, 0]
    free = {3: 1, 2: 0, 0: 0}
    plan, left = spread_destinations([3, 2, 0], free.__getitem__, 5)
    assert (plan, left) == ([(3, 3), (2, 1), (0, 1)], 0)  # free capacity first, then one by one in order
    assert spread_destinations([1], free.__getitem__, 2, exclude=1) == ([], 2)  # no engine at all
