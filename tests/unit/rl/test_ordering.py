from dataclasses import dataclass

import pytest

from gyre.rl.ordering import (
    next_ready_group,
    order_ready_groups,
    ready_group_key,
    staleness,
    take_ready_groups,
)


@dataclass(frozen=True, slots=True)
class ReadyGroup:
    """The fields ordering reads (`ReadyGroupLike`); the packer's own group type has more."""

    group_id: str
    policy_version: int
    ready_time_s: float


def test_oldest_policy_version_first_then_oldest_ready_time():
    groups = [
        ReadyGroup("late-old-version", policy_version=3, ready_time_s=50.0),
        ReadyGroup("early-new-version", policy_version=4, ready_time_s=1.0),
        ReadyGroup("early-old-version", policy_version=3, ready_time_s=10.0),
    ]
    assert [g.group_id for g in order_ready_groups(groups)] == [
        "early-old-version",
        "late-old-version",
        "early-new-version",
    ]
    assert next_ready_group(groups) == groups[2]


def test_ties_break_on_group_id_so_the_order_is_total():
    a = ReadyGroup("a", 1, 5.0)
    b = ReadyGroup("b", 1, 5.0)
    assert order_ready_groups([b, a]) == [a, b]
    assert ready_group_key(a) < ready_group_key(b)


def test_take_and_next_on_few_or_no_groups():
    assert next_ready_group([]) is None
    groups = [ReadyGroup("x", 2, 0.0), ReadyGroup("y", 1, 9.0)]
    assert take_ready_groups(groups, 1) == [groups[1]]
    assert take_ready_groups(groups, 5) == [groups[1], groups[0]]
    with pytest.raises(ValueError):
        take_ready_groups(groups, -1)


def test_works_on_any_object_with_the_fields():
    class Record:
        def __init__(self, group_id: str, policy_version: int, ready_time_s: float) -> None:
            self.group_id, self.policy_version, self.ready_time_s = group_id, policy_version, ready_time_s

    records = [Record("q", 2, 0.0), Record("p", 0, 3.0)]
    assert [r.group_id for r in order_ready_groups(records)] == ["p", "q"]


def test_staleness():
    assert staleness(7, 5) == 2
    assert staleness(5, 5) == 0
    with pytest.raises(ValueError, match="older"):
        staleness(4, 5)
