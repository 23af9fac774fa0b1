"""Per-engine occupancy: reservations, bindings, and what happens when a cell leaves rollout."""

import pytest

from services.scheduler.policy import SEPARATE_POOL, RerouteExecutions
from services.scheduler.policy.placement import Placement


def _placement() -> Placement:
    return Placement(num_cells=3, cell_capacity=2, separate_pool_capacity=1)


def test_reserve_bind_release_keep_loads_and_capacity():
    p = _placement()
    assert p.rollout_capacity == 7
    p.reserve(2, 2)
    assert p.bind("a", 2) is None
    assert p.bind("b", 2) is None
    assert (p.load(2), p.free(2), p.running) == (2, 0, 2)
    assert p.release("a") == 2
    assert (p.load(2), p.running) == (1, 1)


def test_leaving_rollout_reroutes_bound_executions_and_forwards_reservations():
    p = _placement()
    p.reserve(0, 2)
    p.bind("a", 0)  # one bound, one reservation still waiting for its ExecutionStarted
    actions = p.stop_serving(0, [SEPARATE_POOL, 2, 1])
    assert actions == [RerouteExecutions(0, SEPARATE_POOL, ("a",))]
    assert p.rollout_capacity == 5 and p.free(0) == 0
    assert p.engine_of("a") == SEPARATE_POOL
    # The late start names cell 0; it is forwarded to where its slot went (cell 2).
    assert p.bind("b", 0) == 2
    assert p.engine_of("b") == 2 and p.load(2) == 1


def test_a_reservation_that_moved_twice_is_followed():
    p = _placement()
    p.reserve(0, 1)
    p.stop_serving(0, [2, 1])  # slot moves to cell 2
    p.stop_serving(2, [1])  # and on to cell 1
    assert p.bind("late", 0) == 1
    assert p.load(1) == 1


def test_cell_back_in_rollout_serves_again_and_errors_are_named():
    p = _placement()
    p.stop_serving(1, [SEPARATE_POOL, 2, 0])
    p.start_serving(1)
    assert p.free(1) == 2
    with pytest.raises(ValueError, match="never started"):
        p.release("ghost")
    with pytest.raises(ValueError, match="cell index"):
        p.load(7)
    p.reserve(1, 1)
    p.bind("x", 1)
    with pytest.raises(ValueError, match="started twice"):
        p.bind("x", 1)
