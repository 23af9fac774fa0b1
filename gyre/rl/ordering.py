"""Ready-group ordering: the stream packer takes the ready group with the oldest policy version
first, then the one that became ready earliest (then the smaller group id, so the order is total).

Taking the oldest policy version first bounds staleness: a group admitted under version v_d is
trained as soon as possible after it is ready, so `v_t - v_d` does not grow while younger groups
overtake it. Pure functions over anything that has `group_id`, `policy_version` and `ready_time_s`.

    queue = order_ready_groups(ready)          # oldest first
    batch_part = take_ready_groups(ready, 4)   # the next four to pack
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar


class ReadyGroupLike(Protocol):
    """What ordering needs to know about a ready group."""

    @property
    def group_id(self) -> str: ...
    @property
    def policy_version(self) -> int: ...
    @property
    def ready_time_s(self) -> float: ...


G = TypeVar("G", bound=ReadyGroupLike)


def ready_group_key(group: ReadyGroupLike) -> tuple[int, float, str]:
    """Sort key: oldest policy version, then oldest ready time, then group id."""
    return (group.policy_version, group.ready_time_s, group.group_id)


def order_ready_groups(groups: Iterable[G]) -> list[G]:
    """All groups, the one to pack first at index 0."""
    return sorted(groups, key=ready_group_key)


def next_ready_group(groups: Iterable[G]) -> G | None:
    """The group to pack next, or None when there is none."""
    return min(groups, key=ready_group_key, default=None)


def take_ready_groups(groups: Iterable[G], count: int) -> list[G]:
    """The first `count` groups in packing order (fewer when fewer are ready)."""
    if count < 0:
        raise ValueError(f"count must be >= 0; got {count}")
    return order_ready_groups(groups)[:count]


def staleness(trained_version: int, admitted_version: int) -> int:
    """`v_t - v_d`: versions between the policy that admitted a group and the one trained on it."""
    if trained_version < admitted_version:
        raise ValueError(
            f"a group admitted at version {admitted_version} cannot be trained at older version {trained_version}"
        )
    return trained_version - admitted_version
