"""`MicroStep`: the unit of training work a cell claims from the queue.

A micro-step is S rows (admitted trajectories) concatenated into one token stream of T tokens, in
the flash-attn varlen layout: `cu_seqlens` [S+1] holds the row boundaries and `position_ids`
restart at 0 in every row, so a model with block-diagonal causal attention sees each row alone.
Every row of an execution that appears in a micro-step is in that micro-step (the packer
guarantees it), so the execution's sequence ratio s_i can be computed locally.

Per token: the target mask, the recorded behaviour log-prob, the coefficient `1/(L_i·B·N)` (0 off
targets) and the index of the token's execution. Per execution: its id, advantage and number of
targets L_i. Alignment follows `gyre.trajectory.row`: a target at token t is predicted by the
logits at t - 1 of the same row, so the first token of a row is never a target.

`row_chunks` splits a micro-step's rows into consecutive chunks under a token limit: how a cell
trains a micro-step that exceeds its budget (see `gyre.rl.step_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(slots=True, frozen=True)
class MicroStep:
    """A packed micro-step: concatenated rows plus everything the loss needs."""

    batch_id: str
    """Stream (batch) this micro-step belongs to."""
    step: int
    """Optimizer step the batch feeds (the policy version being trained)."""
    index: int
    """Position of the micro-step in its batch's stream, from 0."""
    token_budget: int
    """Budget the packer used; a micro-step over it holds one execution and is trained in chunks."""
    input_ids: npt.NDArray[np.int32]
    """[T] token ids of all rows, concatenated."""
    position_ids: npt.NDArray[np.int32]
    """[T] position of each token inside its row (restarts at 0 per row)."""
    cu_seqlens: npt.NDArray[np.int32]
    """[S+1] row boundaries: row r is tokens cu_seqlens[r]:cu_seqlens[r+1]."""
    target_mask: npt.NDArray[np.bool_]
    """[T] true where the token is an admitted target."""
    behaviour_logprobs: npt.NDArray[np.float32]
    """[T] recorded behaviour log-prob at targets, 0.0 elsewhere."""
    coefficients: npt.NDArray[np.float64]
    """[T] `1 / (L_i · B · N)` at targets of execution i, 0.0 elsewhere."""
    execution_index: npt.NDArray[np.int32]
    """[T] index into `execution_ids` of the row each token belongs to."""
    execution_ids: tuple[str, ...]
    """[E] the executions of this micro-step."""
    advantages: npt.NDArray[np.float64]
    """[E] the group-relative advantage of each execution."""
    execution_num_targets: npt.NDArray[np.int32]
    """[E] L_i: every admitted target of the execution (all of them are in this micro-step)."""

    def __post_init__(self) -> None:
        t = len(self.input_ids)
        e = len(self.execution_ids)
        if len(self.cu_seqlens) < 1 or self.cu_seqlens[0] != 0 or self.cu_seqlens[-1] != t:
            raise ValueError(f"cu_seqlens must start at 0 and end at the token count {t}")
        if np.any(np.diff(self.cu_seqlens) <= 0):
            raise ValueError("cu_seqlens must be strictly increasing (no empty rows)")
        for name in ("position_ids", "target_mask", "behaviour_logprobs", "coefficients", "execution_index"):
            if len(getattr(self, name)) != t:
                raise ValueError(f"{name} must have one entry per token ({t})")
        if len(self.advantages) != e or len(self.execution_num_targets) != e:
            raise ValueError(f"advantages and execution_num_targets need one entry per execution ({e})")
        if len(set(self.execution_ids)) != e:
            raise ValueError("execution_ids must be distinct")
        if t and (self.execution_index.min() < 0 or self.execution_index.max() >= e):
            raise ValueError(f"execution_index must lie in [0, {e})")
        row_execution = self.execution_index[self.cu_seqlens[:-1]]
        if not np.array_equal(self.execution_index, np.repeat(row_execution, np.diff(self.cu_seqlens))):
            raise ValueError("execution_index must be constant inside a row")
        if np.any(self.target_mask[self.cu_seqlens[:-1]]):
            raise ValueError("the first token of a row cannot be a target")
        counts = np.bincount(self.execution_index[self.target_mask], minlength=e)
        if not np.array_equal(counts, self.execution_num_targets):
            raise ValueError(
                "execution_num_targets must count every target of each execution in this micro-step"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_rows(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def num_targets(self) -> int:
        return int(self.target_mask.sum())

    @property
    def num_executions(self) -> int:
        return len(self.execution_ids)

    @property
    def oversize(self) -> bool:
        """True when the micro-step exceeds its budget (then it holds one execution, trained in chunks)."""
        return self.num_tokens > self.token_budget

    @property
    def row_lengths(self) -> npt.NDArray[np.int32]:
        return np.diff(self.cu_seqlens).astype(np.int32)

    @property
    def row_execution(self) -> npt.NDArray[np.int32]:
        """[S] execution index of each row."""
        return self.execution_index[self.cu_seqlens[:-1]]


def row_chunks(cu_seqlens: npt.NDArray[np.int32], chunk_tokens: int) -> list[tuple[int, int]]:
    """Consecutive row ranges [r0, r1) of at most `chunk_tokens` tokens (a longer row is alone)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1; got {chunk_tokens}")
    chunks: list[tuple[int, int]] = []
    start = 0
    num_rows = len(cu_seqlens) - 1
    for r in range(1, num_rows + 1):
        if r > start + 1 and int(cu_seqlens[r]) - int(cu_seqlens[start]) > chunk_tokens:
            chunks.append((start, r - 1))
            start = r - 1
    if num_rows:
        chunks.append((start, num_rows))
    return chunks
