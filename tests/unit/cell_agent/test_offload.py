"""`StateOffload` frees every byte of a trainer's state and restores it bit-exact, for every registered
backend: after a restore the trainer steps exactly like a twin that was never offloaded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from gyre.trainer.backends import TRAINER_BACKENDS
from gyre.trainer.offload import StateOffload
from tests.unit.cell_agent.helpers import batch, trainer


@pytest.fixture
def no_world_left() -> Iterator[None]:
    before = dist.is_initialized()
    yield
    if dist.is_initialized() and not before:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(TRAINER_BACKENDS))
def test_release_frees_everything_and_restore_is_exact(name: str, no_world_left: None) -> None:
    offloaded, twin = trainer(name), trainer(name)
    first, second = batch(offloaded, seed=1), batch(offloaded, seed=2)
    for t in (offloaded, twin):
        for s in first:
            t.accumulate(s)
        t.optimizer_step()
    tensors = offloaded.state_tensors()
    params = offloaded.flat_params
    assert len(tensors) > 2, "the optimizer's state is part of it"
    offload = StateOffload(tensors)
    assert offload.nbytes >= 4 * params.numel() * params.element_size(), "params, grads, exp_avg, exp_avg_sq"
    offload.release()
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors)
    offload.restore()
    assert offloaded.digest() == twin.digest()
    for t in (offloaded, twin):
        for s in second:
            t.accumulate(s)
        t.optimizer_step()
    assert offloaded.digest() == twin.digest(), "a restored trainer steps exactly like one never offloaded"
    assert torch.equal(offloaded.flat_params, twin.flat_params)


def test_a_storage_numpy_has_shared_is_refused() -> None:
    shared = torch.zeros(16)
    shared.numpy()
    with pytest.raises(ValueError, match="cannot be resized: a numpy array has shared them"):
        StateOffload([shared]).release()
    assert shared.untyped_storage().nbytes() == 64, "nothing changed"
