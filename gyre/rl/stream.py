"""The stream packing buffer of one batch: ready groups go in one at a time, full micro-steps
come out, and closing the stream flushes the rest.

Packing one group alone leaves a half-empty micro-step per group; holding back the micro-steps that
are not yet full and re-packing them with the next group's executions keeps micro-steps full while
still emitting work as soon as it can be (cells may be waiting on the queue). A micro-step is
emitted once it is at least `min_fill` of the budget, or when it holds an execution larger than the
budget; `close()` emits everything left, whatever its fill.

    stream = StreamPacker(batch_id="b7", step=7, num_batch_executions=B * N, token_budget=8192)
    for group in ready_groups:                    # oldest policy version first (gyre.rl.ordering)
        queue.extend(stream.add(group.rows, group.advantages))
    queue.extend(stream.close())
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gyre.rl.microstep import MicroStep
from gyre.rl.packing import ExecutionRows, build_microstep, first_fit_decreasing, group_rows
from gyre.trajectory.row import TrajectoryRow


class StreamPacker:
    """Packs the executions of one batch into micro-steps as its groups arrive."""

    def __init__(
        self,
        *,
        batch_id: str,
        step: int,
        num_batch_executions: int,
        token_budget: int,
        min_fill: float = 0.9,
    ) -> None:
        if num_batch_executions < 1:
            raise ValueError(f"num_batch_executions (B·N) must be at least 1; got {num_batch_executions}")
        if token_budget < 1:
            raise ValueError(f"token_budget must be at least 1; got {token_budget}")
        if not 0.0 < min_fill <= 1.0:
            raise ValueError(f"min_fill must be in (0, 1]; got {min_fill}")
        self.batch_id = batch_id
        self.step = step
        self.num_batch_executions = num_batch_executions
        self.token_budget = token_budget
        self.min_fill = min_fill
        self._buffer: list[ExecutionRows] = []
        self._seen: set[str] = set()
        self._num_emitted = 0
        self._closed = False

    @property
    def num_emitted(self) -> int:
        """Micro-steps emitted so far (the next one gets this index)."""
        return self._num_emitted

    @property
    def num_buffered_tokens(self) -> int:
        return sum(e.num_tokens for e in self._buffer)

    @property
    def closed(self) -> bool:
        return self._closed

    def add(self, rows: Sequence[TrajectoryRow], advantages: Mapping[str, float]) -> list[MicroStep]:
        """Take one group's rows (and the advantages of its members); return the micro-steps now full."""
        if self._closed:
            raise ValueError(
                f"stream of batch {self.batch_id!r} is closed; open a new one for the next batch"
            )
        executions = group_rows(rows, advantages)
        for e in executions:
            if e.execution_id in self._seen:
                raise ValueError(
                    f"execution {e.execution_id!r} was already packed in batch {self.batch_id!r}"
                )
        self._seen.update(e.execution_id for e in executions)
        self._buffer.extend(e for e in executions if e.num_targets > 0)
        return self._emit(final=False)

    def close(self) -> list[MicroStep]:
        """Emit everything still buffered; the stream accepts nothing afterwards."""
        if self._closed:
            return []
        self._closed = True
        return self._emit(final=True)

    def _emit(self, *, final: bool) -> list[MicroStep]:
        bins = first_fit_decreasing([e.num_tokens for e in self._buffer], self.token_budget)
        threshold = self.min_fill * self.token_budget
        out: list[MicroStep] = []
        kept: list[ExecutionRows] = []
        for members in bins:
            executions = [self._buffer[i] for i in members]
            size = sum(e.num_tokens for e in executions)
            if final or size >= threshold:
                out.append(
                    build_microstep(
                        executions,
                        num_batch_executions=self.num_batch_executions,
                        token_budget=self.token_budget,
                        batch_id=self.batch_id,
                        step=self.step,
                        index=self._num_emitted,
                    )
                )
                self._num_emitted += 1
            else:
                kept.extend(executions)
        self._buffer = kept
        return out
