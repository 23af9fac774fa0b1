"""A heap-based discrete-event clock: O(log n) per event, ties broken by scheduling order.

loop = EventLoop()
loop.at(3.5, KIND, payload)
while (item := loop.pop()) is not None:
    time_s, kind, payload = item
"""

from __future__ import annotations

import heapq


class EventLoop:
    __slots__ = ("_heap", "_seq", "now_s")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.now_s = 0.0

    def at(self, time_s: float, kind: int, payload: int = 0) -> None:
        """Schedule event `kind` with an int payload at `time_s` (not before now)."""
        assert time_s >= self.now_s, f"cannot schedule into the past: {time_s} < {self.now_s}"
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, kind, payload))

    def pop(self) -> tuple[float, int, int] | None:
        """The next event, advancing the clock to it; None when nothing is scheduled."""
        if not self._heap:
            return None
        time_s, _, kind, payload = heapq.heappop(self._heap)
        self.now_s = time_s
        return time_s, kind, payload

    def __len__(self) -> int:
        return len(self._heap)
