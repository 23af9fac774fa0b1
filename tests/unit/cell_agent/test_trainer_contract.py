"""Every registered trainer backend honours the contract the cell agent relies on, built as a cell
builds it: from the model directory of the config (`create_trainer(name, spec)`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gyre.config.training import TrainerSection
from gyre.model.arch import ModelError
from gyre.model.files import check_model_dir
from gyre.trainer.backends import TRAINER_BACKENDS, create_trainer
from gyre.trainer.layout import check_trainer
from tests.support.models import small_dir
from tests.unit.cell_agent.helpers import batch, spec, trainer


@pytest.fixture
def no_world_left() -> Iterator[None]:
    """A backend may start a torch.distributed world of this process (megatron-core needs one): end it."""
    before = dist.is_initialized()
    yield
    if dist.is_initialized() and not before:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(TRAINER_BACKENDS))
def test_backend_contract(name: str, tmp_path: Path, no_world_left: None) -> None:
    t = trainer(name)
    assert t.version == 0
    params, grads = t.flat_params, t.flat_grads
    assert params.is_contiguous() and grads.shape == params.shape
    names = set(check_model_dir(t.spec.model_dir).arch.parameter_shapes())
    assert set(t.named_weights()) == names, "parameter names are the checkpoint's (Hugging Face) names"
    before = t.digest()
    steps = batch(t)
    for s in steps:
        t.accumulate(s)
    assert t.digest() == before, "weights are frozen while gradients accumulate"
    assert float(grads.abs().sum()) > 0
    address = params.data_ptr()
    t.optimizer_step()
    assert t.version == 1 and t.digest() != before
    assert t.flat_params.data_ptr() == address, "the snapshot buffer never moves"
    assert float(t.flat_grads.abs().sum()) == 0
    t.zero_grads()
    other = create_trainer(name, spec())
    other.load_weights({n: w.clone() for n, w in t.named_weights().items()}, version=1)
    assert other.digest() == t.digest() and other.version == 1
    path = t.save_checkpoint(tmp_path)
    restored = create_trainer(name, spec())
    restored.load_checkpoint(path)
    assert restored.digest() == t.digest() and restored.version == 1


def test_unknown_backend_names_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="'jax' is not registered; available: torch, megatron"):
        create_trainer("jax", spec())


def test_float64_backend() -> None:
    t = trainer(dtype="float64")
    assert t.flat_params.dtype == torch.float64


def test_an_unregistered_backend_stops_the_run_naming_the_field() -> None:
    section = TrainerSection(backend="jax")
    with pytest.raises(ModelError, match=r"cell_agent\.trainer\.backend: 'jax' is not a trainer backend"):
        check_trainer(section, small_dir())
