"""The one log-prob definition the engine, the trainer and the tests share."""

from __future__ import annotations

import pytest
import torch

from gyre.model.logprobs import effective_temperature, logprobs_from_logits, token_logprobs


def test_token_logprobs_is_log_softmax_of_tempered_logits() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    tokens = torch.tensor([0, 2])
    got = token_logprobs(logits, tokens, temperature=0.5)
    want = torch.log_softmax(logits / 0.5, dim=-1)[torch.arange(2), tokens]
    assert torch.allclose(got, want)
    per_row = logprobs_from_logits(logits, torch.tensor([[0.5], [2.0]]))
    assert torch.allclose(per_row[1], torch.log_softmax(logits[1] / 2.0, dim=-1))


def test_greedy_reports_temperature_one() -> None:
    assert effective_temperature(0.0) == 1.0
    assert effective_temperature(0.7) == 0.7
    logits = torch.tensor([1.0, 2.0])
    assert torch.allclose(logprobs_from_logits(logits, 0.0), torch.log_softmax(logits, -1))
    with pytest.raises(ValueError, match="temperature"):
        effective_temperature(-1.0)
