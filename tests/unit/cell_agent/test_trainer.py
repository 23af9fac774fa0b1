"""The torch trainer: a step equals a plain-torch reference, any split of a batch sums to the whole,
checkpoints round-trip model + optimizer + version."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gyre.model.causal_lm import CausalLM
from gyre.model.init import init_model_dir
from gyre.model.weights import assign_weights
from gyre.rl.step_loss import train_microstep
from gyre.trainer.backends.torch_backend import TorchTrainer
from gyre.trainer.checkpoint import latest_checkpoint
from tests.support.models import SMALL
from tests.unit.cell_agent.helpers import batch, trainer


@pytest.mark.parametrize("grad_clip", [0.0, 0.05])
def test_step_equals_plain_torch_reference(grad_clip: float) -> None:
    t = trainer(grad_clip=grad_clip, lr=1e-3, weight_decay=0.01)
    assert isinstance(t, TorchTrainer)
    reference = CausalLM(t.arch)
    assign_weights(reference, {n: w.clone() for n, w in t.named_weights().items()})
    reference.train()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.01)
    for s in batch(t):
        t.accumulate(s)
        train_microstep(s, reference)
    assert set(t.named_weights()) == {n for n, _ in reference.named_parameters()}
    for name, p in reference.named_parameters():
        slot = t.flat.slots[name]
        got = t.flat_grads[slot.offset : slot.offset + slot.numel].view(slot.shape)
        assert p.grad is not None and torch.equal(got, p.grad), name
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), grad_clip or float("inf"))
    optimizer.step()
    got_norm = t.optimizer_step()
    assert got_norm == pytest.approx(
        float(norm), rel=1e-5
    )  # one flat-buffer norm vs norms of per-tensor norms
    if grad_clip:
        assert got_norm > grad_clip, "the clip must be active for this case to mean something"
    # Without a clip the step is bit-identical; with one, the norm of one flat buffer and torch's norm
    # of per-tensor norms round differently (a few ulps of the clip coefficient).
    tolerance = 1e-7 if grad_clip else 0.0
    for name, p in reference.named_parameters():
        assert float((t.named_weights()[name] - p.detach()).abs().max()) <= tolerance, name
    assert t.version == 1
    assert float(t.flat_grads.abs().max()) == 0.0


def test_gradients_of_any_split_sum_to_the_whole_batch() -> None:
    whole, part_a, part_b = (trainer(dtype="float64") for _ in range(3))
    steps = batch(whole, seed=1)
    assert len(steps) >= 3
    for s in steps:
        whole.accumulate(s)
    for i, s in enumerate(steps):
        (part_a if i % 3 == 0 else part_b).accumulate(s)
    summed = part_a.flat_grads + part_b.flat_grads
    assert float((summed - whole.flat_grads).abs().max()) < 1e-12
    assert float(whole.flat_grads.abs().max()) > 0


def test_accumulate_leaves_weights_frozen() -> None:
    t = trainer()
    before = t.digest()
    for s in batch(t, seed=2):
        t.accumulate(s)
    assert t.digest() == before
    assert float(t.flat_grads.abs().sum()) > 0


def test_satellite_has_no_optimizer() -> None:
    t = trainer(with_optimizer=False)
    t.accumulate(batch(t)[0])
    with pytest.raises(RuntimeError, match="only the core"):
        t.optimizer_step()


def test_checkpoint_round_trip_continues_identically(tmp_path: Path) -> None:
    a = trainer(lr=1e-3)
    first, second = batch(a, seed=3), batch(a, seed=4, step=1)
    for s in first:
        a.accumulate(s)
    a.optimizer_step()
    path = a.save_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path) == path
    b = trainer(lr=1e-3)
    b.load_checkpoint(path)
    assert b.version == 1 and b.digest() == a.digest()
    for t in (a, b):
        for s in second:
            t.accumulate(s)
        t.optimizer_step()
    assert a.digest() == b.digest(), "optimizer state must round-trip too"


def test_checkpoint_of_another_architecture_is_refused(tmp_path: Path) -> None:
    a = trainer()
    path = a.save_checkpoint(tmp_path)
    other = trainer()
    wide_dir = init_model_dir(
        tmp_path / "wide",
        arch="llama",
        tokenizer="byte",
        family="chatml",
        overrides={**SMALL, "intermediate_size": 96},
    )
    wide = TorchTrainer.create(
        type(other.spec)(
            other.spec.section,
            wide_dir,
            other.spec.objective,
            with_optimizer=True,
        )
    )
    with pytest.raises(ValueError, match="architecture"):
        wide.load_checkpoint(path)
