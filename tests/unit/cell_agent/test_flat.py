"""Flat parameter and gradient buffers: the views survive backward passes and optimizer steps."""

from __future__ import annotations

import pytest
import torch

from gyre.trainer.flat import FlatParameters
from tests.support.models import load_small


def _model() -> torch.nn.Module:
    return load_small(1).train()


def test_parameters_and_gradients_live_in_the_buffers() -> None:
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    flat = FlatParameters(model)
    assert flat.numel == sum(p.numel() for p in before.values())
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), before[name])
    ids = torch.randint(0, 256, (12,))
    for _ in range(2):
        model(ids, torch.arange(12), [0, 5, 12]).logsumexp(-1).sum().backward()
    flat.check_views()
    assert float(flat.grads.abs().sum()) > 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optimizer.step()
    flat.check_views()
    assert not torch.equal(
        flat.named_tensors()["model.embed_tokens.weight"], before["model.embed_tokens.weight"]
    )


def test_load_named_is_strict_and_digest_tracks_bytes() -> None:
    flat = FlatParameters(_model())
    digest = flat.digest()
    named = {n: t.clone() for n, t in flat.named_tensors().items()}
    named["model.norm.weight"] = named["model.norm.weight"] + 1
    flat.load_named(named)
    assert flat.digest() != digest
    with pytest.raises(ValueError, match="missing"):
        flat.load_named({k: v for k, v in named.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match="shape"):
        flat.load_named({**named, "model.norm.weight": torch.zeros(3)})


def test_zeroing_gradients_by_none_is_detected() -> None:
    model = _model()
    flat = FlatParameters(model)
    torch.optim.SGD(model.parameters(), lr=0.1).zero_grad()  # set_to_none=True by default
    with pytest.raises(AssertionError, match="gradient"):
        flat.check_views()
