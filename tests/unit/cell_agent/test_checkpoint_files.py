"""Checkpoint and publication files: complete-or-absent, newest found, old ones pruned, engine-readable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gyre.model.files import check_model_dir
from gyre.model.weights import load_state_dict
from gyre.trainer.checkpoint import (
    latest_checkpoint,
    published_path,
    read_trainer_checkpoint,
    save_trainer_checkpoint,
    step_dir,
    write_published,
)
from tests.support.models import small_dir
from tests.unit.cell_agent.helpers import trainer


def test_latest_and_prune(tmp_path: Path) -> None:
    t = trainer()
    for version in (1, 2, 3):
        save_trainer_checkpoint(
            tmp_path,
            version=version,
            arch=t.arch,
            tensors=t.named_weights(),
            optimizer=None,
            backend="torch",
            source=small_dir(5),
            keep=2,
        )
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 3)
    assert not step_dir(tmp_path, 1).exists() and step_dir(tmp_path, 2).exists()
    incomplete = step_dir(tmp_path, 9)
    incomplete.mkdir()
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 3), (
        "a directory without trainer.json is not a checkpoint"
    )
    arch, tensors, optimizer, version = read_trainer_checkpoint(step_dir(tmp_path, 3))
    assert version == 3 and optimizer is None and arch == t.arch
    name = "model.embed_tokens.weight"
    assert torch.equal(tensors[name], t.named_weights()[name])
    with pytest.raises(ValueError, match="not a complete"):
        read_trainer_checkpoint(incomplete)


def test_published_directories_are_model_directories(tmp_path: Path) -> None:
    t = trainer()
    for version in (4, 5, 6):
        path = write_published(
            tmp_path, version=version, arch=t.arch, tensors=t.named_weights(), source=small_dir(5), keep=2
        )
    assert path == published_path(tmp_path, 6)
    assert sorted(p.name for p in path.parent.iterdir()) == ["v00000005", "v00000006"]
    info = check_model_dir(path)
    assert info.arch == t.arch and info.policy_version == 6
    assert set(load_state_dict(info)) == set(t.named_weights())
    assert (path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file()
