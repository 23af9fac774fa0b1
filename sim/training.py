"""The training model: how long micro-steps, steps, role transitions and publications take.

A group's executions are packed, in order, into micro-steps of at most `microstep_tokens` trained
tokens (all rows of one execution stay in one micro-step, as the packer does). A training cell
processes a micro-step in `tokens / (cell nodes · node_tokens_per_s)` seconds; cells claim
micro-steps one at a time, so earlier or larger cells take more of a batch. Once a batch's stream is
closed and every micro-step is done, the gradient reduction and optimizer step take `step_overhead_s`.
After a non-final step of a burst the core broadcasts parameters to the satellites (`broadcast_s`);
after the final one it publishes to every rollout engine (`publish_s`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TrainingModel:
    node_tokens_per_s: float
    """Training throughput of one node (forward + backward, trained tokens per second)."""
    microstep_tokens: float
    """Packing budget of one micro-step (trained tokens)."""
    join_s: float = 8.52
    """Rollout → training transition, snapshot pull included (paper: 8.52 s on average)."""
    leave_s: float = 3.46
    """Training → rollout transition, newest weights loaded (paper: 3.46 s on average)."""
    publish_s: float = 30.0
    """Weight publication from the core to every rollout engine."""
    broadcast_s: float = 15.0
    """Parameter broadcast from the core to the satellites after a non-final step of a burst."""
    step_overhead_s: float = 45.0
    """Per step: pipeline drain, gradient reduction across the training prefix, clipping, optimizer."""

    def __post_init__(self) -> None:
        if self.node_tokens_per_s <= 0 or self.microstep_tokens <= 0:
            raise ValueError("node_tokens_per_s and microstep_tokens must be > 0")

    def pack(self, tokens: Sequence[float]) -> list[float]:
        """Micro-step sizes (tokens) for one group's executions; executions with no tokens add nothing."""
        steps: list[float] = []
        current = 0.0
        for t in tokens:
            if t <= 0:
                continue
            if current > 0 and current + t > self.microstep_tokens:
                steps.append(current)
                current = 0.0
            current += t
        if current > 0:
            steps.append(current)
        return steps

    def seconds(self, tokens: float, nodes: int) -> float:
        """Time for a cell of `nodes` nodes to train `tokens` tokens."""
        return tokens / (nodes * self.node_tokens_per_s)
