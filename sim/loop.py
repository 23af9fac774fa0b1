"""A heap-based discrete-event clock: O(log n) per event, ties broken by scheduling order.

loop = EventLoop()
timer = loop.at(3.5, KIND, payload)
loop.cancel(timer)                  # it will not come (it was moved, or what it finishes was lost)
while (item := loop.pop()) is not None:
    time_s, kind, payload = item
"""

from __future__ import annotations

import heapq

(
    EXEC_END,
    GROUP_READY,
    TRANSITION_DONE,
    MICRO_DONE,
    STEP_DONE,
    PUBLISH_DONE,
    TICK,
    CELL_READY,
    EXEC_START,
    CELL_LOADED,
    CORE_RESTORED,
    CHECKPOINT,
) = range(12)
"""The simulator's event kinds (sim/simulation.py handles them, in this order)."""


class EventLoop:
    __slots__ = ("_cancelled", "_heap", "_seq", "now_s")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._cancelled: set[int] = set()
        self.now_s = 0.0

    def at(self, time_s: float, kind: int, payload: int = 0) -> int:
        """Schedule event `kind` with an int payload at `time_s` (not before now); returns its timer."""
        assert time_s >= self.now_s, f"cannot schedule into the past: {time_s} < {self.now_s}"
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, kind, payload))
        return self._seq

    def peek_s(self) -> float | None:
        """Time of the next event (None when nothing is scheduled)."""
        self._drop_cancelled()
        return self._heap[0][0] if self._heap else None

    def advance(self, time_s: float) -> None:
        """Move the clock to `time_s` (an event from outside the heap happens then; nothing is skipped)."""
        assert time_s >= self.now_s and (not self._heap or time_s <= self._heap[0][0]), (
            "advance past an event"
        )
        self.now_s = time_s

    def delay_all(self, delay_s: float) -> None:
        """Everything scheduled happens `delay_s` later (a stop-the-world pause); the order is kept."""
        self._heap = [(t + delay_s, seq, kind, payload) for t, seq, kind, payload in self._heap]

    def cancel(self, timer: int) -> None:
        """The event `at` returned `timer` for will not come."""
        self._cancelled.add(timer)

    def pop(self) -> tuple[float, int, int] | None:
        """The next event, advancing the clock to it; None when nothing is scheduled."""
        self._drop_cancelled()
        if not self._heap:
            return None
        time_s, _, kind, payload = heapq.heappop(self._heap)
        self.now_s = time_s
        return time_s, kind, payload

    def _drop_cancelled(self) -> None:
        while self._cancelled and self._heap and self._heap[0][1] in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._heap)[1])

    def __len__(self) -> int:
        return len(self._heap)
