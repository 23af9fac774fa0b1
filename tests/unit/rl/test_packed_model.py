"""A packed micro-step through the model gives the same per-token log-probs as running
each row alone (the contract between gyre.rl's packing and gyre.model's packed forward)."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from gyre.model.logprobs import token_logprobs
from gyre.model.weights import load_model
from gyre.rl.packing import pack
from gyre.trajectory.row import TrajectoryRow
from tests.support.models import cell_dir


def _row(execution_id: str, length: int, rng: np.random.Generator, index: int = 0) -> TrajectoryRow:
    mask = rng.random(length) < 0.5
    mask[0] = False
    return TrajectoryRow(
        execution_id=execution_id,
        trajectory_index=index,
        leaf_class="main",
        token_ids=rng.integers(0, 256, length).astype(np.int32),
        target_mask=mask,
        behaviour_logprobs=np.where(mask, -1.0, 0.0).astype(np.float32),
        policy_versions=np.zeros(length, dtype=np.int32),
    )


def test_packed_microstep_matches_rows_alone() -> None:
    torch.manual_seed(0)
    model = load_model(cell_dir()).eval()
    rng = np.random.default_rng(0)
    rows = [_row("a", 37, rng), _row("a", 11, rng, 1), _row("b", 64, rng), _row("c", 5, rng)]
    steps = pack(rows, {"a": 1.0, "b": -1.0, "c": 0.5}, num_batch_executions=3, token_budget=256)
    assert len(steps) == 1
    step = steps[0]
    with torch.no_grad():
        ids = torch.as_tensor(step.input_ids, dtype=torch.long)
        logits = model(ids, torch.as_tensor(step.position_ids, dtype=torch.long), step.cu_seqlens.tolist())
        packed = token_logprobs(logits[:-1], ids[1:])
        bounds = step.cu_seqlens.tolist()
        for start, end in itertools.pairwise(bounds):
            row_ids = ids[start:end]
            alone = model(row_ids, torch.arange(end - start), [0, end - start])
            expected = token_logprobs(alone[:-1], row_ids[1:])
            torch.testing.assert_close(packed[start : end - 1], expected, atol=1e-5, rtol=0)
