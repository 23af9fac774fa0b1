"""Sampling: filters, per-request seeding independent of the batch, log-probs from the same logits."""

from __future__ import annotations

import torch

from services.cell_agent.engine.protocol import SamplingParams
from services.cell_agent.engine.sampler import request_generator, sample


def _logits(rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_logprob_is_log_softmax_at_the_request_temperature() -> None:
    logits = _logits(3)
    params = [SamplingParams(temperature=t) for t in (0.5, 1.0, 1.7)]
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    tokens, logprobs = sample(logits, params, gens)
    for b, p in enumerate(params):
        want = torch.log_softmax(logits[b] / p.temperature, dim=-1)[tokens[b]]
        assert abs(logprobs[b] - want.item()) <= 1e-6


def test_greedy_takes_the_argmax_and_reports_temperature_one() -> None:
    logits = _logits(2)
    tokens, logprobs = sample(logits, [SamplingParams(temperature=0.0)] * 2, [torch.Generator()] * 2)
    assert tokens == logits.argmax(-1).tolist()
    assert abs(logprobs[0] - torch.log_softmax(logits[0], -1).max().item()) <= 1e-6


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = _logits(1, seed=3)
    order = logits[0].argsort(descending=True).tolist()
    probs = torch.softmax(logits[0], -1)
    seen_k, seen_p = set(), set()
    nucleus, mass = set(), 0.0
    for t in order:  # smallest prefix with mass >= 0.6
        nucleus.add(t)
        mass += probs[t].item()
        if mass >= 0.6:
            break
    for i in range(300):
        gen = torch.Generator().manual_seed(i)
        seen_k.add(sample(logits, [SamplingParams(top_k=3)], [gen])[0][0])
        gen = torch.Generator().manual_seed(i)
        seen_p.add(sample(logits, [SamplingParams(top_p=0.6)], [gen])[0][0])
    assert seen_k <= set(order[:3]) and len(seen_k) > 1
    assert seen_p <= nucleus


def test_min_p_drops_unlikely_tokens() -> None:
    logits = torch.tensor([[5.0, 4.5, 0.0, -2.0]])
    seen = {
        sample(logits, [SamplingParams(min_p=0.1)], [torch.Generator().manual_seed(i)])[0][0]
        for i in range(200)
    }
    assert seen == {0, 1}


def test_a_request_samples_the_same_tokens_whatever_else_is_in_the_batch() -> None:
    logits = _logits(4, seed=5)
    alone = [
        sample(logits[2:3], [SamplingParams()], [request_generator(0, "rid-2", None)])[0][0] for _ in range(1)
    ]
    gens = [request_generator(0, f"rid-{b}", None) for b in range(4)]
    batched, _ = sample(logits, [SamplingParams()] * 4, gens)
    assert batched[2] == alone[0]


def test_sampling_seed_overrides_the_rid_derivation() -> None:
    a = request_generator(0, "x", 42).initial_seed()
    assert a == request_generator(9, "y", 42).initial_seed() == 42
    assert request_generator(0, "x", None).initial_seed() != request_generator(0, "y", None).initial_seed()
    assert request_generator(0, "x", None).initial_seed() == request_generator(0, "x", None).initial_seed()
