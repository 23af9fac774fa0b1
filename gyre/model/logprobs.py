"""The one definition of a token log-prob that the engine, the trainer and the tests share.

    logprob(y | c) = log_softmax(logits(c) / temperature)[y]

computed in float32 over the *whole* vocabulary. Top-p / top-k truncation changes which tokens can be
sampled but not the reported value: the engine reports this untruncated tempered log-prob (as SGLang
does), and the trainer recomputes exactly the same quantity for π_θ, so the importance ratio
π_θ / p_roll compares like with like.

Greedy decoding (temperature below `GREEDY_EPS`) is reported at temperature 1: SGLang maps
temperature 0 to "temperature 1, top_k 1", and so do we.
"""

from __future__ import annotations

import torch

GREEDY_EPS = 1e-6


def effective_temperature(temperature: float) -> float:
    """The temperature the log-probs are computed at (1.0 for greedy decoding)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0; got {temperature}")
    return 1.0 if temperature < GREEDY_EPS else temperature


def logprobs_from_logits(logits: torch.Tensor, temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    """Full log-distribution: log_softmax(logits / T) in float32. `temperature` is a float or a
    tensor broadcastable to `logits[..., :1]` (one temperature per row)."""
    scaled = logits.float()
    if isinstance(temperature, torch.Tensor):
        scaled = scaled / temperature.to(scaled.dtype)
    else:
        scaled = scaled / effective_temperature(temperature)
    return torch.log_softmax(scaled, dim=-1)


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Log-probs of `tokens` [...] under `logits` [..., V] at `temperature`."""
    logp = logprobs_from_logits(logits, temperature)
    return logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
