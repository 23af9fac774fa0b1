"""Stream packing: admitted rows → micro-steps under a token budget, each target token carrying its
fixed coefficient `1 / (L_i · B · N)`.

Why the coefficient goes on the token: the batch loss is `1/(B·N) · Σ_i 1/L_i · Σ_{u∈T_i} ℓ_u`
(docs/design.md "Objective"), a plain sum over tokens once each token carries `1/(L_i·B·N)`. Any
split of the micro-steps over any number of cells then sums to the exact batch gradient. `B·N`
counts every raw execution of the batch, excluded ones included, so the packer passes it in
(`num_batch_executions`) instead of counting the executions it happens to see.

Packing unit: an execution (all its rows). All rows of one execution go into one micro-step so s_i
is local. Executions are placed first-fit decreasing by token count; an execution larger than the
budget gets a micro-step of its own, which the cell trains in chunks (`gyre.rl.step_loss`). An
execution without targets (L_i = 0, e.g. a placeholder) contributes zero loss and is dropped here.
Rows may be path rows or tree rows (`gyre.trajectory.materialize`); a micro-step with a tree row
carries the `TreeLayout` of all its rows, and the token count that packing and the budget see is
the tree row's, each shared prefix counted once.

    steps = pack(rows, advantages, num_batch_executions=B * N, token_budget=8192, batch_id="b7", step=7)

The record (`MicroStep`) and its bytes codec live in `gyre.rl.microstep` and `gyre.rl.codec`; they
are re-exported here so a packer needs only this module. The cell side, a micro-step's loss given a
logits function (chunked for oversize executions), is `gyre.rl.step_loss`: it needs torch, which
this module and the packer do not. The stream buffer that feeds groups in one at a time is
`gyre.rl.stream.StreamPacker`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre.model.tree_layout import TreeLayout
from gyre.rl.codec import CODEC_VERSION, decode_microstep, encode_microstep
from gyre.rl.microstep import MicroStep, path_positions
from gyre.trajectory.row import TrajectoryRow

__all__ = [
    "CODEC_VERSION",
    "ExecutionRows",
    "MicroStep",
    "build_microstep",
    "decode_microstep",
    "encode_microstep",
    "first_fit_decreasing",
    "group_rows",
    "pack",
    "token_coefficient",
]


@dataclass(slots=True, frozen=True)
class ExecutionRows:
    """The rows of one execution with its advantage: the unit the packer places."""

    execution_id: str
    advantage: float
    rows: tuple[TrajectoryRow, ...]
    """Ordered by trajectory index (admission draw order)."""

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.rows)

    @property
    def num_targets(self) -> int:
        """L_i = |T_i|: admitted targets are disjoint across rows, so this is the sum over rows."""
        return sum(r.num_targets for r in self.rows)


def token_coefficient(num_targets: int, num_batch_executions: int) -> float:
    """The coefficient of each target of an execution with L_i targets: 1 / (L_i · B · N); 0 when L_i = 0."""
    if num_batch_executions < 1:
        raise ValueError(f"num_batch_executions (B·N) must be at least 1; got {num_batch_executions}")
    if num_targets < 0:
        raise ValueError(f"num_targets must be >= 0; got {num_targets}")
    return 0.0 if num_targets == 0 else 1.0 / (num_targets * num_batch_executions)


def group_rows(rows: Sequence[TrajectoryRow], advantages: Mapping[str, float]) -> list[ExecutionRows]:
    """Rows grouped by execution (in order of first appearance), each with its advantage."""
    by_execution: dict[str, list[TrajectoryRow]] = {}
    for row in rows:
        by_execution.setdefault(row.execution_id, []).append(row)
    out: list[ExecutionRows] = []
    for execution_id, execution_rows in by_execution.items():
        if execution_id not in advantages:
            raise ValueError(
                f"rows of execution {execution_id!r} have no advantage; excluded executions must not "
                "be materialized into rows"
            )
        advantage = float(advantages[execution_id])
        if not math.isfinite(advantage):
            raise ValueError(f"execution {execution_id!r} has a non-finite advantage {advantage}")
        execution_rows.sort(key=lambda r: r.trajectory_index)
        indices = [r.trajectory_index for r in execution_rows]
        if len(set(indices)) != len(indices):
            raise ValueError(f"execution {execution_id!r} has two rows with the same trajectory index")
        for r in execution_rows:
            if not np.all(np.isfinite(r.behaviour_logprobs[r.target_mask])):
                raise ValueError(
                    f"execution {execution_id!r} row {r.trajectory_index} has a non-finite behaviour log-prob"
                )
        out.append(ExecutionRows(execution_id, advantage, tuple(execution_rows)))
    return out


def first_fit_decreasing(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of item indices: items in decreasing size (ties by index) go to the first bin they fit.

    An item larger than `capacity` gets a bin of its own. Bins come out in creation order.
    """
    if capacity < 1:
        raise ValueError(f"token budget must be at least 1; got {capacity}")
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda j: (-sizes[j], j)):
        size = sizes[i]
        if size > capacity:
            bins.append([i])
            free.append(0)
            continue
        for b, room in enumerate(free):
            if size <= room:
                bins[b].append(i)
                free[b] -= size
                break
        else:
            bins.append([i])
            free.append(capacity - size)
    return bins


def build_microstep(
    executions: Sequence[ExecutionRows],
    *,
    num_batch_executions: int,
    token_budget: int,
    batch_id: str,
    step: int,
    index: int,
) -> MicroStep:
    """Concatenate the rows of `executions` (in the given order) into one micro-step; it carries a
    `TreeLayout` of all its rows when any of them is a tree row."""
    rows = [r for e in executions for r in e.rows]
    tree = TreeLayout.concat([r.layout for r in rows]) if any(r.tree is not None for r in rows) else None
    lengths = np.array([r.num_tokens for r in rows], dtype=np.int64)
    cu_seqlens = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu_seqlens[1:])
    row_execution = np.repeat(np.arange(len(executions), dtype=np.int32), [len(e.rows) for e in executions])
    target_mask = np.concatenate([r.target_mask for r in rows]) if rows else np.zeros(0, np.bool_)
    coefficient = np.array(
        [token_coefficient(e.num_targets, num_batch_executions) for e in executions], dtype=np.float64
    )
    execution_index = np.repeat(row_execution, lengths).astype(np.int32)
    return MicroStep(
        batch_id=batch_id,
        step=step,
        index=index,
        token_budget=token_budget,
        input_ids=np.concatenate([r.token_ids for r in rows]).astype(np.int32)
        if rows
        else np.zeros(0, np.int32),
        position_ids=path_positions(cu_seqlens, tree),
        cu_seqlens=cu_seqlens,
        target_mask=target_mask,
        behaviour_logprobs=np.where(
            target_mask,
            np.concatenate([r.behaviour_logprobs for r in rows]) if rows else np.zeros(0, np.float32),
            np.float32(0.0),
        ).astype(np.float32),
        coefficients=np.where(target_mask, coefficient[execution_index], 0.0),
        execution_index=execution_index,
        execution_ids=tuple(e.execution_id for e in executions),
        advantages=np.array([e.advantage for e in executions], dtype=np.float64),
        execution_num_targets=np.array([e.num_targets for e in executions], dtype=np.int32),
        tree=tree,
        behaviour_versions=np.where(
            target_mask,
            np.concatenate([r.policy_versions for r in rows]) if rows else np.zeros(0, np.int32),
            -1,
        ).astype(np.int32),
        routed_experts=_routing(rows),
    )


def _routing(rows: Sequence[TrajectoryRow]) -> npt.NDArray[np.int16] | None:
    """[T, L·k] the rows' recorded MoE routing (-1 in rows without it); None when no row has any."""
    width = next((r.routed_experts.shape[1] for r in rows if r.routed_experts is not None), 0)
    if not width:
        return None
    return np.concatenate(
        [
            r.routed_experts if r.routed_experts is not None else np.full((r.num_tokens, width), -1, np.int16)
            for r in rows
        ]
    )


def pack(
    rows: Sequence[TrajectoryRow],
    advantages: Mapping[str, float],
    *,
    num_batch_executions: int,
    token_budget: int,
    batch_id: str = "",
    step: int = 0,
    first_index: int = 0,
) -> list[MicroStep]:
    """Pack rows into micro-steps of at most `token_budget` tokens (first-fit decreasing by execution).

    `advantages` maps every execution that has rows to its advantage; `num_batch_executions` is B·N
    of the whole batch. Micro-steps are numbered from `first_index`.
    """
    if num_batch_executions < 1:
        raise ValueError(f"num_batch_executions (B·N) must be at least 1; got {num_batch_executions}")
    executions = [e for e in group_rows(rows, advantages) if e.num_targets > 0]
    executions.sort(key=lambda e: e.execution_id)
    bins = first_fit_decreasing([e.num_tokens for e in executions], token_budget)
    return [
        build_microstep(
            [executions[i] for i in members],
            num_batch_executions=num_batch_executions,
            token_budget=token_budget,
            batch_id=batch_id,
            step=step,
            index=first_index + k,
        )
        for k, members in enumerate(bins)
    ]
