"""Checkpoints (safetensors + config metadata) and the one log-prob definition."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gyre.model.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from gyre.model.config import ModelConfig
from gyre.model.logprobs import effective_temperature, logprobs_from_logits, token_logprobs
from gyre.model.transformer import build_model

SMALL = ModelConfig(num_layers=1, d_model=16, num_heads=2, ffn_hidden=32, max_seq_len=64)


def test_checkpoint_roundtrip_keeps_weights_config_and_metadata(tmp_path: Path) -> None:
    model = build_model(SMALL, seed=7)
    path = save_checkpoint(model, tmp_path / "ckpt" / "model.safetensors", {"policy_version": "12"})
    loaded, metadata = load_checkpoint(tmp_path / "ckpt")  # a directory resolves to model.safetensors
    assert loaded.config == SMALL
    assert metadata == {"policy_version": "12"}
    for (name, p), (name2, q) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert name == name2 and torch.equal(p, q)
    config, tensors, _ = read_checkpoint(path)
    assert config == SMALL and set(tensors) == set(dict(model.named_parameters()))


def test_checkpoint_rejects_bad_metadata_and_foreign_files(tmp_path: Path) -> None:
    model = build_model(SMALL)
    with pytest.raises(ValueError, match="strings"):
        save_checkpoint(model, tmp_path / "a.safetensors", {"step": 3})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(model, tmp_path / "a.safetensors", {"gyre_model_config": "{}"})
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(ValueError, match="gyre_model_config"):
        load_checkpoint(tmp_path / "foreign.safetensors")
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.safetensors")


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
