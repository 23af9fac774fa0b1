"""Checkpoint and publication files: complete-or-absent, newest found, old ones pruned, engine-readable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gyre.model.checkpoint import read_checkpoint
from gyre.trainer.checkpoint import (
    latest_checkpoint,
    published_path,
    read_trainer_checkpoint,
    save_trainer_checkpoint,
    step_dir,
    write_published,
)
from tests.unit.cell_agent.helpers import trainer


def test_latest_and_prune(tmp_path: Path) -> None:
    t = trainer()
    for version in (1, 2, 3):
        save_trainer_checkpoint(tmp_path, version=version, config=t.config, tensors=t.named_weights(),
                                optimizer=None, backend="torch", keep=2)
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 3)
    assert not step_dir(tmp_path, 1).exists() and step_dir(tmp_path, 2).exists()
    incomplete = step_dir(tmp_path, 9)
    incomplete.mkdir()
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 3), "a directory without trainer.json is not a checkpoint"
    config, tensors, optimizer, version = read_trainer_checkpoint(step_dir(tmp_path, 3))
    assert version == 3 and optimizer is None and config == t.config
    assert torch.equal(tensors["embed.weight"], t.named_weights()["embed.weight"])
    with pytest.raises(ValueError, match="not a complete"):
        read_trainer_checkpoint(incomplete)


def test_published_files_are_model_checkpoints(tmp_path: Path) -> None:
    t = trainer()
    for version in (4, 5, 6):
        path = write_published(tmp_path, version=version, config=t.config, tensors=t.named_weights(), keep=2)
    assert path == published_path(tmp_path, 6)
    assert sorted(p.name for p in path.parent.iterdir()) == ["v00000005.safetensors", "v00000006.safetensors"]
    config, tensors, metadata = read_checkpoint(path)
    assert config == t.config and metadata["policy_version"] == "6"
    assert set(tensors) == set(t.named_weights())
