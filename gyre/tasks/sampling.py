"""Weighted query selection: a deterministic, interleaved cycle in which each task's share of draws
is its share of the total weight (smooth weighted round robin over a seeded order).

    cycle = WeightedCycle([("tasks/fix-add", 2.0), ("add/3+5", 1.0)], seed=0)
    [cycle.next() for _ in range(3)]      # fix-add twice and add/3+5 once, interleaved

Every draw adds each task's weight to its credit and takes the task with the most credit, which
then pays the total weight back. With equal weights that is a round robin over a seeded shuffle, so
each task comes up once per len(tasks) draws; with any weights the counts after n draws are within
one of n × weight / total. Pure: no I/O, no randomness after the seeded shuffle.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


class WeightedCycle:
    def __init__(self, entries: Sequence[tuple[str, float]], seed: int) -> None:
        pool = [(task_id, float(w)) for task_id, w in entries if w > 0]
        if not pool:
            raise ValueError("no task with a positive weight to draw from")
        random.Random(seed).shuffle(pool)
        self._ids = [t for t, _ in pool]
        self._weights = [w for _, w in pool]
        self._total = sum(self._weights)
        self._credit = [0.0] * len(pool)

    def next(self) -> str:
        best = 0
        for i, w in enumerate(self._weights):
            self._credit[i] += w
            if self._credit[i] > self._credit[best]:
                best = i
        self._credit[best] -= self._total
        return self._ids[best]
