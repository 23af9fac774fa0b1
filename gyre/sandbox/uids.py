"""Sandbox uid ranges: each service instance owns a disjoint range, because a sweep kills every
process of a uid and RLIMIT_NPROC counts per uid."""

from __future__ import annotations

import itertools


def uid_range(uid_base: int, instance: int | None, num_slots: int) -> range:
    """The sandbox uids of one service instance: instance i uses uid_base + 1000 i + [0, num_slots)."""
    start = uid_base + 1000 * (instance or 0)
    return range(start, start + num_slots)


def check_disjoint(**ranges: range) -> None:
    """`ValueError` naming the fix when two services' sandbox uid ranges overlap (they would kill
    each other's sandboxes: a sweep kills every process of a uid)."""
    items = sorted(ranges.items(), key=lambda kv: kv[1].start)
    for (name_a, a), (name_b, b) in itertools.pairwise(items):
        if a.stop > b.start:
            raise ValueError(
                f"sandbox uids of {name_a} ({a.start}..{a.stop - 1}) and {name_b} ({b.start}..{b.stop - 1}) "
                "overlap; move one of the sandbox.uid_base values"
            )
