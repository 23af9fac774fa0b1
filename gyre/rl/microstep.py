"""`MicroStep`: the unit of training work a cell claims from the queue.

A micro-step is S rows concatenated into one token stream of T tokens, in the flash-attn varlen
layout: `cu_seqlens` [S+1] holds the row boundaries, and a model with block-diagonal attention sees
each row alone. A row is a path (one admitted trajectory: positions restart at 0, causal attention)
or a tree row (several admitted paths of one root, each shared prefix once). When any row is a tree
row, `tree` is the `TreeLayout` of all S rows (a path row is one segment of it): positions are the
depth along each token's own path, attention is ancestor-only, and the logits that predict a
target are those of its predecessor on its path (`gyre.model.tree_layout`). Every row of an
execution that appears in a micro-step is in that micro-step (the packer guarantees it), so the
execution's sequence ratio s_i can be computed locally.

Per token: the target mask, the recorded behaviour log-prob, the coefficient `1/(L_i·B·N)` (0 off
targets) and the index of the token's execution. Per execution: its id, advantage and number of
targets L_i. Alignment follows `gyre.trajectory.row`: a target is predicted by the logits of its
predecessor in the same row (t - 1 in a path row), so the first token of a row is never a target.

`row_chunks` splits a micro-step's rows into consecutive chunks under a token limit: how a cell
trains a micro-step that exceeds its budget (see `gyre.rl.step_loss`). `as_path_rows` turns tree
rows back into path rows with the same loss, for a trainer without ancestor-only attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre.model.tree_layout import TreeLayout


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
    """[T] position of each token along its path (restarts at 0 per row; the depth in a tree row)."""
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
    tree: TreeLayout | None = None
    """The segments of all S rows when any row is a tree row; None when every row is a path."""
    behaviour_versions: npt.NDArray[np.int32] | None = None
    """[T] the policy version of the weights that sampled each target (-1 off targets or where unknown);
    None when not recorded. The trainer measures the train/inference mismatch on the targets sampled
    at its own version (`step`)."""
    routed_experts: npt.NDArray[np.int16] | None = None
    """[T, L·k] the MoE experts the engine chose for each token (-1: not known), which the trainer
    replays with `cell_agent.trainer.routing_replay` (`gyre.model.routing`); None when not recorded."""

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
        if self.behaviour_versions is not None and len(self.behaviour_versions) != t:
            raise ValueError(f"behaviour_versions must have one entry per token ({t})")
        if self.routed_experts is not None and (
            self.routed_experts.ndim != 2 or len(self.routed_experts) != t
        ):
            raise ValueError(f"routed_experts must be [T={t}, L·k]; got {self.routed_experts.shape}")
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
        if self.tree is not None and not np.array_equal(self.tree.cu_seqlens(), self.cu_seqlens):
            raise ValueError("the tree layout must describe exactly the micro-step's rows")
        if not np.array_equal(self.position_ids, path_positions(self.cu_seqlens, self.tree)):
            raise ValueError("position_ids must be each token's position along its own path")
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

    @property
    def layout(self) -> TreeLayout:
        """The rows' layout (`tree`, or one segment per row)."""
        return self.tree if self.tree is not None else TreeLayout.path_rows(self.row_lengths)

    def as_path_rows(self) -> MicroStep:
        """The same micro-step with every tree row expanded into its root-to-leaf paths.

        Each target stays a target in exactly one path (the first in tree order that holds it) and
        keeps its coefficient, so the loss and its gradient are those of the tree rows."""
        if self.tree is None:
            return self
        paths: list[npt.NDArray[np.int64]] = []
        targets: list[npt.NDArray[np.bool_]] = []
        claimed = np.zeros(self.num_tokens, np.bool_)
        for chain in self.tree.chains():
            index = np.concatenate([chain.context, np.arange(chain.start, chain.end)])
            targets.append(self.target_mask[index] & ~claimed[index])
            claimed[index] = True
            paths.append(index)
        index = np.concatenate(paths)
        mask = np.concatenate(targets)
        lengths = np.array([len(p) for p in paths], dtype=np.int64)
        cu_seqlens = np.zeros(len(paths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu_seqlens[1:])
        return MicroStep(
            batch_id=self.batch_id,
            step=self.step,
            index=self.index,
            token_budget=self.token_budget,
            input_ids=self.input_ids[index],
            position_ids=path_positions(cu_seqlens, None),
            cu_seqlens=cu_seqlens,
            target_mask=mask,
            behaviour_logprobs=np.where(mask, self.behaviour_logprobs[index], np.float32(0.0)).astype(
                np.float32
            ),
            coefficients=np.where(mask, self.coefficients[index], 0.0),
            execution_index=self.execution_index[index],
            execution_ids=self.execution_ids,
            advantages=self.advantages,
            execution_num_targets=self.execution_num_targets,
            behaviour_versions=None
            if self.behaviour_versions is None
            else np.where(mask, self.behaviour_versions[index], -1).astype(np.int32),
            routed_experts=None if self.routed_experts is None else self.routed_experts[index],
        )


def path_positions(cu_seqlens: npt.NDArray[np.int32], tree: TreeLayout | None) -> npt.NDArray[np.int32]:
    """[T] each token's position along its own path: from 0 per row, or the depth in a tree row."""
    if tree is not None:
        return tree.position_ids()
    lengths = np.diff(cu_seqlens)
    return (np.arange(int(cu_seqlens[-1])) - np.repeat(cu_seqlens[:-1], lengths)).astype(np.int32)


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
