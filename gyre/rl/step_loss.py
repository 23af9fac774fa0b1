"""A micro-step's loss given a logits function, and the gradient pass a training cell runs on it.

The logits function follows the model contract of the packed path:
`logits = logits_fn(input_ids [T] int64, position_ids [T] int64, cu_seqlens [S+1] int32, tree)` →
[T, V], with `tree` the micro-step's `TreeLayout` (None when every row is a path) and the attention
of `gyre.model.attention.packed_attention`. The log-prob of a target comes from the logits of its
predecessor on its path: t - 1 in a path row, `TreeLayout.predecessors` in a tree row (a row's
first token is never a target). With routing replay (`routing_replay=True`, MoE models) it gets a
fifth argument, the engine's experts of those tokens, `routed_experts` [T, L·k] int64 (a row of -1:
route freely), and must route every token through them (`gyre.model.routing`).

Executions larger than the budget (chunked path). The packer gives such an execution a micro-step
of its own; `train_microstep` then splits its rows into chunks of at most `chunk_tokens` tokens (a
single row longer than that is one chunk: the packed model has no cache across chunks) and runs
two passes:

1. a no-grad forward over every chunk, which yields the log-probs of all targets of the execution
   and hence log s_i over the whole T_i (`microstep_log_seq_ratios`);
2. per chunk, a forward with gradient, the loss with that log s_i fixed (so the clip decision is
   the execution's, not the chunk's), and a backward that accumulates into `.grad`.

A token correction's band (`gyre.rl.corrections`) is likewise decided in pass 1: it yields the
execution's kept-target count L'_i, and pass 2 rescales every chunk's kept targets by L_i / L'_i.

s_i carries no gradient and the loss is a sum over tokens, so the accumulated gradient equals that
of one unchunked pass (up to summation order; tested to 1e-12 in float64). The price is one extra
forward of that execution. Chunks are cut at row boundaries only: a tree row is never split (it is
one chunk when it is longer than `chunk_tokens`, like a long path row), so the largest forward of a
chunked micro-step is its longest row — for tree rows, the union of one root's admitted paths. The two passes must see the same weights and a deterministic model (no
dropout), which holds while a batch is being accumulated: weights are frozen until the optimizer step.

Reducing across cells: every token already carries 1/(L_i·B·N), so the batch gradient is the SUM of
the cells' accumulated gradients — all-reduce with SUM, never average, and do not divide by the
number of micro-steps.

    result = train_microstep(step, model, objective=ObjectiveParams(), device="cpu")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from gyre.model.tree_layout import TreeLayout
from gyre.rl.corrections import kept_normalizer_scale
from gyre.rl.loss import DEFAULT_OBJECTIVE, ObjectiveParams, gspo_loss, sequence_metrics, token_keep
from gyre.rl.loss_metrics import LossMetrics
from gyre.rl.microstep import MicroStep, row_chunks

LogitsFn = Callable[..., torch.Tensor]
"""`logits_fn(input_ids, position_ids, cu_seqlens, tree[, routed_experts]) -> logits [T, V]` (see the
module docstring)."""


@dataclass(slots=True, frozen=True)
class StepResult:
    """What one micro-step's gradient pass produced."""

    metrics: LossMetrics
    num_chunks: int
    """1 for a normal micro-step; more when an oversize execution was trained in chunks."""


@dataclass(slots=True, frozen=True)
class _Tensors:
    cu_host: list[int]
    """Row boundaries on the host (slicing without device syncs)."""
    targets_host: npt.NDArray[np.int64]
    """Target positions on the host."""
    tree: TreeLayout | None
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    target_positions: torch.Tensor
    source_positions: torch.Tensor
    """The token whose logits predict each target (its predecessor on its path)."""
    behaviour_logprobs: torch.Tensor
    coefficients: torch.Tensor
    target_execution: torch.Tensor
    advantages: torch.Tensor
    num_targets: torch.Tensor
    on_policy: torch.Tensor | None
    """[U] the targets sampled at the trainer's version (`step`); None when versions were not recorded."""
    num_on_policy: torch.Tensor | None
    """[E] their count per execution."""
    routed_experts: torch.Tensor | None = None
    """[T, L·k] the experts to replay (routing replay on), else None."""


def _tensors(step: MicroStep, device: torch.device | str, routing_replay: bool = False) -> _Tensors:
    targets = np.flatnonzero(step.target_mask)
    if routing_replay and step.routed_experts is None:
        raise ValueError(
            f"routing replay is on but micro-step {step.batch_id}/{step.index} carries no routed experts: the "
            "engines returned none (SGLang needs --enable-return-routed-experts; the model must be MoE)"
        )
    sources = targets - 1 if step.tree is None else step.tree.predecessors()[targets]

    def put(a: npt.NDArray[Any], dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

    on_policy = None if step.behaviour_versions is None else step.behaviour_versions[targets] == step.step
    num_on_policy = (
        None
        if on_policy is None
        else np.bincount(step.execution_index[targets][on_policy], minlength=step.num_executions)
    )

    return _Tensors(
        cu_host=[int(x) for x in step.cu_seqlens],
        targets_host=targets,
        tree=step.tree,
        input_ids=put(step.input_ids, torch.int64),
        position_ids=put(step.position_ids, torch.int64),
        cu_seqlens=put(step.cu_seqlens, torch.int32),
        target_positions=put(targets, torch.int64),
        source_positions=put(sources, torch.int64),
        behaviour_logprobs=put(step.behaviour_logprobs[targets], torch.float32),
        coefficients=put(step.coefficients[targets], torch.float64),
        target_execution=put(step.execution_index[targets], torch.int64),
        advantages=put(step.advantages, torch.float64),
        num_targets=put(step.execution_num_targets, torch.int64),
        on_policy=None if on_policy is None else put(on_policy, torch.bool),
        num_on_policy=None if num_on_policy is None else put(num_on_policy, torch.int64),
        routed_experts=put(step.routed_experts, torch.int64)
        if routing_replay and step.routed_experts is not None
        else None,
    )


def target_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    target_positions: torch.Tensor,
    source_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """log π(y_t | tokens before t on its path) for each target position t, from the logits at
    `source_positions` (default t - 1, the predecessor in a path row).

    Low-precision logits are promoted to float32 first; only the target rows are normalized.
    """
    sources = target_positions - 1 if source_positions is None else source_positions
    rows = logits.index_select(0, sources)
    rows = rows.to(torch.promote_types(rows.dtype, torch.float32))
    picked = rows.gather(1, input_ids.index_select(0, target_positions).unsqueeze(1)).squeeze(1)
    return picked - torch.logsumexp(rows, dim=-1)


def _target_slice(t: _Tensors, row_start: int, row_end: int) -> slice:
    """The targets of rows [row_start, row_end) as a slice of the per-target arrays."""
    lo, hi = np.searchsorted(t.targets_host, [t.cu_host[row_start], t.cu_host[row_end]])
    return slice(int(lo), int(hi))


def _chunk_logprobs(
    t: _Tensors, logits_fn: LogitsFn, row_start: int, row_end: int
) -> tuple[torch.Tensor, slice]:
    """Log-probs of the targets of rows [row_start, row_end) and their slice in the per-target arrays."""
    a, b = t.cu_host[row_start], t.cu_host[row_end]
    sl = _target_slice(t, row_start, row_end)
    whole = row_start == 0 and row_end == len(t.cu_host) - 1
    tree = t.tree if t.tree is None or whole else t.tree.rows(row_start, row_end)
    if tree is not None and tree.is_paths:
        tree = None
    args = (t.input_ids[a:b], t.position_ids[a:b], t.cu_seqlens[row_start : row_end + 1] - a, tree)
    logits = logits_fn(*args) if t.routed_experts is None else logits_fn(*args, t.routed_experts[a:b])
    if logits.dim() != 2 or logits.shape[0] != b - a:
        raise ValueError(f"logits_fn must return [{b - a}, vocab] logits; got {tuple(logits.shape)}")
    return target_logprobs(
        logits, t.input_ids[a:b], t.target_positions[sl] - a, t.source_positions[sl] - a
    ), sl


def microstep_loss(
    step: MicroStep,
    logits_fn: LogitsFn,
    *,
    objective: ObjectiveParams = DEFAULT_OBJECTIVE,
    device: torch.device | str = "cpu",
    routing_replay: bool = False,
) -> tuple[torch.Tensor, LossMetrics]:
    """The loss of a whole micro-step in one forward (with gradient); the caller runs backward."""
    return _whole_loss(_tensors(step, device, routing_replay), logits_fn, objective)


def _whole_loss(
    t: _Tensors, logits_fn: LogitsFn, objective: ObjectiveParams
) -> tuple[torch.Tensor, LossMetrics]:
    logprobs, _ = _chunk_logprobs(t, logits_fn, 0, len(t.cu_host) - 1)
    return gspo_loss(
        logprobs,
        t.behaviour_logprobs,
        t.advantages,
        t.target_execution,
        t.coefficients,
        objective=objective,
        on_policy=t.on_policy,
    )


def microstep_log_seq_ratios(
    step: MicroStep, logits_fn: LogitsFn, *, chunk_tokens: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """log s_i [E] of every execution of the micro-step, from a no-grad pass in chunks."""
    t = _tensors(step, device)
    return _log_seq_ratios(t, logits_fn, row_chunks(step.cu_seqlens, chunk_tokens))


def _log_seq_ratios(t: _Tensors, logits_fn: LogitsFn, chunks: list[tuple[int, int]]) -> torch.Tensor:
    log_s, _ = _execution_pass(t, logits_fn, chunks, DEFAULT_OBJECTIVE)
    return log_s


def _execution_pass(
    t: _Tensors, logits_fn: LogitsFn, chunks: list[tuple[int, int]], objective: ObjectiveParams
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """No-grad pass over all chunks: log s_i [E] over the targets the token correction keeps, and their
    count L'_i [E] (None under `tis`, which keeps every target)."""
    num_executions = t.advantages.shape[0]
    sums = torch.zeros(num_executions, dtype=torch.float64, device=t.advantages.device)
    kept_counts = torch.zeros(num_executions, dtype=torch.int64, device=t.advantages.device)
    with torch.no_grad():
        for r0, r1 in chunks:
            logprobs, sl = _chunk_logprobs(t, logits_fn, r0, r1)
            log_ratio = logprobs - t.behaviour_logprobs[sl].to(logprobs.dtype)
            kept = token_keep(log_ratio, objective)
            values = log_ratio.double() if kept is None else log_ratio.double() * kept
            sums.index_add_(0, t.target_execution[sl], values)
            if kept is not None:
                kept_counts.index_add_(0, t.target_execution[sl], kept.long())
    if objective.token_band is None:
        return sums / t.num_targets.clamp(min=1).to(sums.dtype), None
    return sums / kept_counts.clamp(min=1).to(sums.dtype), kept_counts


def train_microstep(
    step: MicroStep,
    logits_fn: LogitsFn,
    *,
    objective: ObjectiveParams = DEFAULT_OBJECTIVE,
    chunk_tokens: int | None = None,
    device: torch.device | str = "cpu",
    routing_replay: bool = False,
) -> StepResult:
    """Forward and backward of one micro-step: gradients accumulate into the parameters' `.grad`.

    `chunk_tokens` defaults to the micro-step's token budget; a micro-step within it takes one
    pass, a larger one takes the two-pass chunked path of the module docstring. `routing_replay`:
    the MoE layers use the engine's experts (`MicroStep.routed_experts`, required then).
    """
    limit = step.token_budget if chunk_tokens is None else chunk_tokens
    t = _tensors(step, device, routing_replay)
    chunks = row_chunks(step.cu_seqlens, limit)
    if len(chunks) <= 1:
        loss, metrics = _whole_loss(t, logits_fn, objective)
        if loss.requires_grad:
            torch.autograd.backward(loss)
        return StepResult(metrics=metrics, num_chunks=1)

    log_s, num_kept = _execution_pass(t, logits_fn, chunks, objective)
    scale = None if num_kept is None else kept_normalizer_scale(t.num_targets, num_kept)
    metrics = sequence_metrics(t.advantages, log_s, t.num_targets, objective, num_kept, t.num_on_policy)
    for r0, r1 in chunks:
        target_slice = _target_slice(t, r0, r1)
        if target_slice.start == target_slice.stop:
            continue
        logprobs, sl = _chunk_logprobs(t, logits_fn, r0, r1)
        loss, chunk_metrics = gspo_loss(
            logprobs,
            t.behaviour_logprobs[sl],
            t.advantages,
            t.target_execution[sl],
            t.coefficients[sl],
            objective=objective,
            log_seq_ratio=log_s,
            normalizer_scale=scale,
            on_policy=None if t.on_policy is None else t.on_policy[sl],
            execution_metrics=False,
        )
        torch.autograd.backward(loss)
        metrics = metrics.merge(chunk_metrics)
    return StepResult(metrics=metrics, num_chunks=len(chunks))
