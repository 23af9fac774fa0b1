import copy
import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.rl.codec import decode_microstep, encode_microstep
from gyre.rl.loss import ObjectiveParams, gspo_loss
from gyre.rl.packing import pack
from gyre.rl.step_loss import (
    microstep_log_seq_ratios,
    microstep_loss,
    target_logprobs,
    train_microstep,
)
from tests.unit.rl.helpers import TinyLM, logprobs_alone, make_row, random_batch


@functools.cache
def model64() -> TinyLM:
    return TinyLM(dtype=torch.float64, seed=0)


def flat_grad(model):
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()]
    )


def gradient_of(steps, model, **kwargs):
    """The gradient accumulated over `steps` from zero, as one cell would compute it."""
    model.zero_grad(set_to_none=True)
    metrics = None
    for step in steps:
        result = train_microstep(step, model, **kwargs)
        metrics = result.metrics if metrics is None else metrics.merge(result.metrics)
    return flat_grad(model), metrics


def test_packed_microstep_gives_each_rows_own_logprobs():
    model = TinyLM(dtype=torch.float32, seed=3)
    rng = np.random.default_rng(0)
    rows, advantages, bn = random_batch(rng, model, num_groups=2, group_size=4, max_len=40)
    (step,) = pack(rows, advantages, num_batch_executions=bn, token_budget=10_000)
    assert step.num_rows > 4
    ids = torch.as_tensor(step.input_ids, dtype=torch.int64)
    positions = torch.as_tensor(np.setdiff1d(np.arange(step.num_tokens), step.cu_seqlens[:-1]))
    with torch.no_grad():
        logits = model(
            ids, torch.as_tensor(step.position_ids, dtype=torch.int64), torch.as_tensor(step.cu_seqlens)
        )
        packed = target_logprobs(logits, ids, positions).numpy()
    bounds = list(zip(step.cu_seqlens, step.cu_seqlens[1:], strict=False))
    alone_full = np.concatenate([logprobs_alone(model, step.input_ids[a:b]) for a, b in bounds])
    alone = np.delete(alone_full, step.cu_seqlens[:-1])
    assert np.max(np.abs(packed - alone)) <= 1e-5

    # and the micro-step loss is the loss of those per-row log-probs
    loss, _ = microstep_loss(step, model)
    m = step.target_mask
    expected, _ = gspo_loss(
        torch.as_tensor(alone_full[m]),
        torch.as_tensor(step.behaviour_logprobs[m]),
        torch.as_tensor(step.advantages),
        torch.as_tensor(step.execution_index[m]),
        torch.as_tensor(step.coefficients[m]),
    )
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-4)


def test_random_batch_mixes_clipped_and_kept_executions():
    rows, advantages, bn = random_batch(np.random.default_rng(5), model64(), num_groups=4)
    (step,) = pack(rows, advantages, num_batch_executions=bn, token_budget=10**6)
    _, metrics = gradient_of([step], model64())
    assert 0 < metrics.num_clipped_executions < metrics.num_executions


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    budget=st.integers(25, 160),
    num_cells=st.integers(1, 3),
    data=st.data(),
)
def test_gradient_is_the_same_for_any_split_across_cells(seed, budget, num_cells, data):
    model = model64()
    rows, advantages, bn = random_batch(np.random.default_rng(seed), model)
    whole = pack(rows, advantages, num_batch_executions=bn, token_budget=10**6)
    assert len(whole) <= 1
    reference, reference_metrics = gradient_of(whole, model)

    steps = pack(rows, advantages, num_batch_executions=bn, token_budget=budget)
    cell_of = data.draw(st.lists(st.integers(0, num_cells - 1), min_size=len(steps), max_size=len(steps)))
    total = torch.zeros_like(reference)
    merged = None
    for cell in range(num_cells):
        # each micro-step travels through the queue codec, as between processes
        mine = [
            decode_microstep(encode_microstep(s)) for s, c in zip(steps, cell_of, strict=True) if c == cell
        ]
        grad, metrics = gradient_of(mine, model)
        total += grad
        if metrics is not None:
            merged = metrics if merged is None else merged.merge(metrics)
    assert float((total - reference).abs().max()) <= 1e-6
    if reference_metrics is not None:
        for key, value in reference_metrics.summary().items():
            assert merged.summary()[key] == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), key


def oversize_execution(model, shift):
    """One execution of four rows; targets of the first two rows have log ρ = +shift, of the last two -shift."""
    rng = np.random.default_rng(4)
    rows = []
    for j in range(4):
        tokens = rng.integers(0, 20, size=12)
        targets = np.zeros(12, bool)
        targets[2:8] = True
        behaviour = logprobs_alone(model, tokens) - (shift if j < 2 else -shift)
        rows.append(make_row("big", j, tokens, targets, behaviour))
    return rows


def test_chunked_execution_uses_the_whole_sequence_ratio():
    model = model64()
    # mean log ρ over the execution is 0 (kept), but the first two rows alone would be clipped
    (step,) = pack(oversize_execution(model, 0.05), {"big": 1.0}, num_batch_executions=4, token_budget=30)
    assert step.oversize
    log_s = microstep_log_seq_ratios(step, model, chunk_tokens=24)
    assert abs(float(log_s[0])) < 1e-6
    one_pass, one_metrics = gradient_of([step], model, chunk_tokens=10**6)
    chunked_model = copy.deepcopy(model)
    chunked_model.zero_grad(set_to_none=True)
    result = train_microstep(step, chunked_model)
    assert result.num_chunks == 2
    assert float((flat_grad(chunked_model) - one_pass).abs().max()) <= 1e-12
    assert float(one_pass.abs().max()) > 0.0
    assert result.metrics.num_executions == one_metrics.num_executions == 1
    assert result.metrics.num_clipped_executions == 0
    for key, value in one_metrics.summary().items():
        assert result.metrics.summary()[key] == pytest.approx(value, rel=1e-9), key


@pytest.mark.parametrize("chunk_tokens", [1, 12, 13, 25, 36])
def test_chunked_gradient_equals_one_pass_for_any_chunk_size(chunk_tokens):
    model = model64()
    (step,) = pack(oversize_execution(model, 0.01), {"big": -0.7}, num_batch_executions=4, token_budget=10**6)
    one_pass, _ = gradient_of([step], model)
    chunked, _ = gradient_of([step], model, chunk_tokens=chunk_tokens)
    assert float((chunked - one_pass).abs().max()) <= 1e-12


def test_objective_parameters_reach_the_loss():
    model = model64()
    (step,) = pack(oversize_execution(model, 0.05), {"big": 1.0}, num_batch_executions=4, token_budget=10**6)
    default, _ = gradient_of([step], model)
    # a ratio cap below every token's ratio changes every weight
    capped, capped_metrics = gradient_of([step], model, objective=ObjectiveParams(token_ratio_cap=0.5))
    assert capped_metrics.num_ratio_capped_tokens == capped_metrics.num_targets
    assert not torch.allclose(capped, default)


def test_logits_fn_must_return_one_row_per_token():
    model = model64()
    (step,) = pack(oversize_execution(model, 0.0), {"big": 1.0}, num_batch_executions=1, token_budget=10**6)
    with pytest.raises(ValueError, match="logits"):
        microstep_loss(step, lambda ids, pos, cu, tree: model(ids, pos, cu, tree)[:-1])
