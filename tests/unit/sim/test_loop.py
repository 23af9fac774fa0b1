"""The event loop orders by time, then by scheduling order."""

import pytest

from sim.loop import EventLoop


def test_events_come_in_time_order_and_ties_in_scheduling_order():
    loop = EventLoop()
    loop.at(5.0, 1, 10)
    loop.at(2.0, 2, 20)
    loop.at(5.0, 3, 30)
    assert [loop.pop(), loop.pop(), loop.pop(), loop.pop()] == [
        (2.0, 2, 20),
        (5.0, 1, 10),
        (5.0, 3, 30),
        None,
    ]
    assert loop.now_s == 5.0
    with pytest.raises(AssertionError, match="past"):
        loop.at(1.0, 0)
