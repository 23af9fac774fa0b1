"""Eq. 6: for a fixed admitted target set of an execution, which admitted path carries a shared
target (and in which order the paths were admitted) changes neither the execution's loss, nor s_i,
nor the clip decision, nor the gradient."""

import functools

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gyre.rl.packing import pack
from gyre.rl.step_loss import microstep_loss
from tests.unit.rl.helpers import VOCAB, TinyLM, logprobs_alone, make_row


@functools.cache
def model() -> TinyLM:
    return TinyLM(dtype=torch.float64, seed=1)


def evaluate(rows, advantage):
    (step,) = pack(rows, {"e": advantage}, num_batch_executions=8, token_budget=10**6)
    m = model()
    m.zero_grad(set_to_none=True)
    loss, metrics = microstep_loss(step, m)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in m.parameters()])
    return float(loss.detach()), metrics, grad


@st.composite
def execution(draw):
    prefix = draw(st.lists(st.integers(0, VOCAB - 1), min_size=3, max_size=12))
    suffix_a = draw(st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=8))
    suffix_b = draw(st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=8))
    shared = draw(st.lists(st.booleans(), min_size=len(prefix) - 1, max_size=len(prefix) - 1))
    own_a = draw(st.lists(st.booleans(), min_size=len(suffix_a), max_size=len(suffix_a)))
    own_b = draw(st.lists(st.booleans(), min_size=len(suffix_b), max_size=len(suffix_b)))
    on_b = draw(st.lists(st.booleans(), min_size=len(prefix) - 1, max_size=len(prefix) - 1))
    noise = st.floats(-0.02, 0.02, allow_nan=False)
    prefix_noise = draw(st.lists(noise, min_size=len(prefix), max_size=len(prefix)))
    noise_a = draw(st.lists(noise, min_size=len(suffix_a), max_size=len(suffix_a)))
    noise_b = draw(st.lists(noise, min_size=len(suffix_b), max_size=len(suffix_b)))
    advantage = draw(st.sampled_from([-1.3, -0.2, 0.0, 0.4, 2.0]))
    swap = draw(st.booleans())
    return (
        prefix,
        suffix_a,
        suffix_b,
        shared,
        own_a,
        own_b,
        on_b,
        prefix_noise,
        noise_a,
        noise_b,
        advantage,
        swap,
    )


def build(prefix, suffix, shared_here, own, prefix_noise, noise, index):
    tokens = np.array(prefix + suffix)
    targets = np.array([False, *shared_here, *own])
    behaviour = logprobs_alone(model(), tokens) + np.array(prefix_noise + noise)
    return make_row("e", index, tokens, targets, behaviour)


@settings(max_examples=60, deadline=None)
@given(case=execution())
def test_moving_a_shared_target_between_paths_changes_nothing(case):
    (
        prefix,
        suffix_a,
        suffix_b,
        shared,
        own_a,
        own_b,
        on_b,
        prefix_noise,
        noise_a,
        noise_b,
        advantage,
        swap,
    ) = case
    assume(any(shared) or any(own_a) or any(own_b))  # L_i = 0 is covered by the loss tests

    def rows(assign_to_b):
        in_a = [s and not b for s, b in zip(shared, assign_to_b, strict=True)]
        in_b = [s and b for s, b in zip(shared, assign_to_b, strict=True)]
        ia, ib = (1, 0) if swap else (0, 1)
        return [
            build(prefix, suffix_a, in_a, own_a, prefix_noise, noise_a, ia),
            build(prefix, suffix_b, in_b, own_b, prefix_noise, noise_b, ib),
        ]

    base_loss, base, base_grad = evaluate(rows([False] * len(shared)), advantage)
    loss, moved, grad = evaluate(rows(on_b), advantage)
    assert moved.num_targets == base.num_targets
    assert loss == pytest.approx(base_loss, rel=1e-10, abs=1e-14)
    assert moved.seq_ratio_sum == pytest.approx(base.seq_ratio_sum, rel=1e-12)
    assert moved.num_clipped_executions == base.num_clipped_executions
    assert torch.allclose(grad, base_grad, rtol=1e-9, atol=1e-14)
