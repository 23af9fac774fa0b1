"""Batched sampling with temperature, top-k, top-p and min-p, one seeded generator per request.

Each request owns a `torch.Generator` seeded from its `sampling_seed` (or from the engine seed and its
rid), so its samples do not depend on which other requests share the batch. The draw is by inverse
CDF: one uniform u per row from the row's generator, the token is the first whose cumulative
(filtered, unnormalized) probability exceeds u times the row's total — an exact sample, and one
random number per token instead of one per vocabulary entry (an exponential race over a 150K
vocabulary costs more than the forward of a small model).

The returned log-prob is the one `gyre.model.logprobs` defines: log_softmax(logits / T) of the sampled
token over the whole vocabulary, from the very logits that were sampled — top-k/top-p/min-p only
restrict which tokens can be drawn (SGLang reports the same quantity). Which filters apply is read
from the parameters, so the common case (none) is four passes over the vocabulary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from gyre.model.logprobs import effective_temperature
from services.cell_agent.engine.protocol import SamplingParams


def request_generator(engine_seed: int, rid: str, sampling_seed: int | None) -> torch.Generator:
    """The generator of one request: `sampling_seed` if given, else derived from (engine seed, rid)."""
    if sampling_seed is not None:
        seed = sampling_seed
    else:
        digest = hashlib.blake2b(f"{engine_seed}:{rid}".encode(), digest_size=8).digest()
        seed = int.from_bytes(digest, "little") & ((1 << 63) - 1)
    return torch.Generator().manual_seed(seed)


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> tuple[list[int], list[float]]:
    """Sample one token per row of `logits` [B, V]; returns (token ids, their log-probs).

    Four passes over the vocabulary: max, x - max, exp, cumsum (in place). The log-prob of the
    drawn token is (x - max) - log Σ exp(x - max), log_softmax's own formula, with the sum read off
    the cumulative sum the draw needs anyway; greedy rows take the argmax of the same logits."""
    num_rows, vocab = logits.shape
    assert num_rows == len(params) == len(generators)
    temps = [effective_temperature(p.temperature) for p in params]
    scaled = logits.float()
    if any(t != 1.0 for t in temps):
        scaled = scaled / torch.tensor(temps, dtype=torch.float32).unsqueeze(1)
    shifted = scaled - scaled.amax(dim=-1, keepdim=True)
    weights = shifted.exp()  # unnormalized probabilities
    greedy = [p.greedy for p in params]
    if all(greedy):
        tokens = shifted.argmax(dim=-1)
        total = weights.sum(dim=-1)
    else:
        uniforms = torch.cat([torch.rand(1, generator=gen) for gen in generators])
        if _any_filter(params, vocab):
            total = weights.sum(dim=-1)
            weights = _filter(weights, total, params, vocab)
            cdf = weights.cumsum_(dim=-1)
        else:
            cdf = weights.cumsum_(dim=-1)
            total = cdf[:, -1]
        targets = (uniforms * cdf[:, -1]).unsqueeze(1)
        tokens = torch.searchsorted(cdf, targets, right=True).squeeze(1).clamp_(max=vocab - 1)
        if any(greedy):
            tokens = torch.where(torch.tensor(greedy), shifted.argmax(dim=-1), tokens)
    picked = shifted.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens.tolist(), (picked - total.log()).tolist()


def _any_filter(params: Sequence[SamplingParams], vocab: int) -> bool:
    return any(0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0 for p in params)


def _filter(
    weights: torch.Tensor, total: torch.Tensor, params: Sequence[SamplingParams], vocab: int
) -> torch.Tensor:
    """`weights` (unnormalized probabilities, row sums `total`) with the tokens outside top-k / top-p /
    min-p zeroed (not renormalized: the draw only needs proportions)."""
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p for p in params]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_w, order = weights.sort(dim=-1, descending=True)
        rank = torch.arange(vocab).unsqueeze(0)
        mass_before = (sorted_w.cumsum(dim=-1) - sorted_w) / total.unsqueeze(1)
        drop = (rank >= torch.tensor(top_k).unsqueeze(1)) | (
            (mass_before > torch.tensor(top_p, dtype=torch.float32).unsqueeze(1)) & (rank > 0)
        )
        sorted_w = sorted_w.masked_fill(drop, 0.0)
        weights = torch.zeros_like(weights).scatter_(1, order, sorted_w)
    min_p = [p.min_p for p in params]
    if any(m > 0 for m in min_p):
        threshold = weights.max(dim=-1, keepdim=True).values * torch.tensor(min_p).unsqueeze(1)
        weights = weights.masked_fill(weights < threshold, 0.0)
    return weights
