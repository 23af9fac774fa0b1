"""Identifiers shared across services (engine, group, execution and batch ids, queue names), defined once."""

from __future__ import annotations


def cell_engine_id(cell: int) -> str:
    """The id of cell `cell`'s rollout engine (in the proxy's table and on the wire)."""
    return f"cell-{cell}"


def group_id(seq: int) -> str:
    """The id of a run's `seq`-th dispatched group (1, 2, …)."""
    return f"g{seq:05d}"


def execution_id(group: str, index: int) -> str:
    """The id of member `index` of group `group` (the demo harness seeds its tool sleeps with it)."""
    return f"{group}-e{index:02d}"


def batch_id(run_id: str, step: int) -> str:
    """The batch that optimizer step `step` consumes (stable across restarts)."""
    return f"{run_id}-b{step}"


def step_of_batch(batch_id_: str) -> int:
    """Inverse of `batch_id`; a ValueError names the bad id."""
    head, sep, step = batch_id_.rpartition("-b")
    if not sep or not head or not step.isdigit():
        raise ValueError(f"batch id must look like '<run>-b<step>'; got {batch_id_!r}")
    return int(step)


def microstep_queue(batch_id_: str) -> str:
    """Name of the reliable work queue holding the micro-steps of a batch."""
    return f"microsteps:{batch_id_}"


EVALUATIONS_QUEUE = "evaluations"
"""Name of the evaluator's reliable work queue (one item per terminated execution)."""
