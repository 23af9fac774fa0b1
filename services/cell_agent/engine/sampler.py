"""Batched sampling with temperature, top-k, top-p and min-p, one seeded generator per request.

Each request owns a `torch.Generator` seeded from its `sampling_seed` (or from the engine seed and its
rid), so its samples do not depend on which other requests share the batch. The draw is by inverse
CDF: one uniform u per row from the row's generator, the token is the first whose cumulative
(filtered, unnormalized) probability exceeds u times the row's total — an exact sample, and one
random number per token instead of one per vocabulary entry (an exponential race over a 150K
vocabulary costs more than the forward of a small model).

The returned log-prob is the one `gyre.model.logprobs` defines: log_softmax(logits / T) of the sampled
token over the whole vocabulary, from the very logits that were sampled — top-k/top-p/min-p only
restrict which tokens can be drawn (SGLang reports the same quantity).
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
    """Sample one token per row of `logits` [B, V]; returns (token ids, their log-probs)."""
    num_rows, vocab = logits.shape
    assert num_rows == len(params) == len(generators)
    temps = torch.tensor([effective_temperature(p.temperature) for p in params], dtype=torch.float32)
    logp = torch.log_softmax(logits.float() / temps.unsqueeze(1), dim=-1)
    greedy = torch.tensor([p.greedy for p in params])
    uniforms = torch.cat([torch.rand(1, generator=gen) for gen in generators])
    cdf = _filter(logp, params, vocab).cumsum_(dim=-1)
    targets = (uniforms * cdf[:, -1]).unsqueeze(1)
    drawn = torch.searchsorted(cdf, targets, right=True).squeeze(1).clamp_(max=vocab - 1)
    tokens = torch.where(greedy, logp.argmax(dim=-1), drawn)
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens.tolist(), chosen.tolist()


def _filter(logp: torch.Tensor, params: Sequence[SamplingParams], vocab: int) -> torch.Tensor:
    """Probabilities with the tokens outside top-k / top-p / min-p zeroed (not renormalized: the race
    only needs proportions)."""
    probs = logp.exp()
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
    min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32)
    if bool((top_k < vocab).any()) or bool((top_p < 1.0).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        rank = torch.arange(vocab).unsqueeze(0)
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p
        drop = (rank >= top_k.unsqueeze(1)) | ((mass_before > top_p.unsqueeze(1)) & (rank > 0))
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
    if bool((min_p > 0).any()):
        threshold = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs
