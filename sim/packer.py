"""The simulated stream packer: the trajectory buffer of ready groups and the open batch's stream.

Ready groups wait in the buffer ordered oldest policy version first (then readiness). With streaming,
the packer pulls one group whenever fewer than `low_water` micro-steps are waiting to be claimed, so
it stays just ahead of the training cells and keeps preferring old groups; without streaming, it
waits until every group the batch needs is ready and packs them all at once. The stream closes after
B groups.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

from sim.training import TrainingModel


class SimPacker:
    def __init__(self, training: TrainingModel, *, batch_groups: int, streaming: bool) -> None:
        self._training = training
        self._batch_groups = batch_groups
        self._streaming = streaming
        self._ready: list[tuple[int, int, int]] = []  # (dispatch version, ready order, group)
        self._ready_order = 0
        self.step: int | None = None
        self.packed = 0
        self.closed = False
        self.queue: deque[tuple[float, int]] = deque()  # (tokens, group) of unclaimed micro-steps
        self.in_flight = 0
        self.num_microsteps = 0
        self.packed_tokens = 0.0
        """Tokens of the open batch's micro-steps (what its step trains)."""

    def add_ready(self, group: int, dispatch_version: int) -> None:
        heapq.heappush(self._ready, (dispatch_version, self._ready_order, group))
        self._ready_order += 1

    def open(self, step: int) -> None:
        assert self.step is None, f"batch {self.step} is still open"
        self.step = step
        self.packed = 0
        self.closed = False
        self.num_microsteps = 0
        self.packed_tokens = 0.0

    def finish(self) -> None:
        """The optimizer step consumed the batch."""
        assert self.complete, "batch finished before its micro-steps were done"
        self.step = None

    @property
    def complete(self) -> bool:
        return self.step is not None and self.closed and not self.queue and self.in_flight == 0

    def pull(self, group_tokens: Sequence[Sequence[float]], low_water: int) -> list[int]:
        """Pack ready groups into the open batch; returns the groups packed by this call."""
        if self.step is None or self.closed:
            return []
        needed = self._batch_groups - self.packed
        packed: list[int] = []
        if self._streaming:
            while len(packed) < needed and self._ready and len(self.queue) < low_water:
                packed.append(self._pack(heapq.heappop(self._ready)[2], group_tokens))
        elif len(self._ready) >= needed:
            packed = [self._pack(heapq.heappop(self._ready)[2], group_tokens) for _ in range(needed)]
        if self.packed == self._batch_groups:
            self.closed = True
        return packed

    def _pack(self, group: int, group_tokens: Sequence[Sequence[float]]) -> int:
        for tokens in self._training.pack(group_tokens[group]):
            self.queue.append((tokens, group))
            self.num_microsteps += 1
            self.packed_tokens += tokens
        self.packed += 1
        return group

    def claim(self) -> tuple[float, int] | None:
        if not self.queue:
            return None
        self.in_flight += 1
        return self.queue.popleft()

    def requeue(self, items: Sequence[tuple[float, int]]) -> None:
        """Micro-steps whose gradients were lost (their cell left training) are claimed again, first."""
        self.queue.extendleft(reversed(items))

    def done(self) -> None:
        assert self.in_flight > 0
        self.in_flight -= 1
