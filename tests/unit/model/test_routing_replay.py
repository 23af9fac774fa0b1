"""Routing replay (R3) in the MoE block: a perturbed router flips experts between two forwards without
replay and none with it; replaying a forward's own routing changes nothing; replayed tokens keep the
router's gradient; the engine's batched `serve` path records and replays the same experts."""

from __future__ import annotations

import pytest
import torch

from gyre.model.causal_lm import CausalLM, SparseMoeBlock
from gyre.model.init import init_model_dir
from gyre.model.routing import ExpertRouting
from gyre.model.weights import load_model
from tests.support.models import MOE_MIXED

SMALL = MOE_MIXED
"""Layers 0 and 2 sparse, 1 dense (its routing rows stay -1)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CausalLM:
    path = init_model_dir(
        tmp_path_factory.mktemp("r3") / "moe",
        arch="qwen3_moe",
        tokenizer="byte",
        family="qwen3",
        seed=11,
        overrides=SMALL,
    )
    return load_model(path)


def _perturbed(model: CausalLM, scale: float) -> CausalLM:
    """The same model with noise on every router (the trainer a step or a dtype away)."""
    other = CausalLM(model.arch)
    other.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in other.model.layers:
            if isinstance(layer.mlp, SparseMoeBlock):
                w = layer.mlp.gate.weight
                w.add_(torch.randn(w.shape, generator=gen) * scale * w.abs().mean())
    return other


def _ids(model: CausalLM, n: int = 160) -> torch.Tensor:
    return torch.randint(0, model.arch.vocab_size, (n,), generator=torch.Generator().manual_seed(3))


def _forward(model: CausalLM, ids: torch.Tensor, routing: ExpertRouting) -> torch.Tensor:
    return model(ids, torch.arange(len(ids)), [0, len(ids)], routing=routing)


def _flips(a: torch.Tensor, b: torch.Tensor) -> int:
    """Token-layer pairs whose expert sets differ (the order inside top-k does not matter)."""
    return int((a.sort(dim=-1).values != b.sort(dim=-1).values).any(dim=-1).sum())


def test_router_noise_flips_experts_without_replay_and_none_with_it(model: CausalLM) -> None:
    ids = _ids(model)
    trainer = _perturbed(model, scale=0.5)
    engine_routing = ExpertRouting()
    with torch.no_grad():
        _forward(model, ids, engine_routing)
    sampled = engine_routing.stacked(model.arch.num_layers, 2)
    assert sampled.shape == (len(ids), 3, 2)
    assert bool((sampled[:, 1] == -1).all()) and bool((sampled[:, [0, 2]] >= 0).all())

    free, replayed = ExpertRouting(), ExpertRouting(replay=sampled)
    with torch.no_grad():
        _forward(trainer, ids, free)
        _forward(trainer, ids, replayed)
    assert _flips(free.stacked(3, 2), sampled) > 0
    assert _flips(replayed.stacked(3, 2), sampled) == 0
    assert torch.equal(replayed.stacked(3, 2), sampled)


def test_replaying_a_forwards_own_routing_changes_nothing(model: CausalLM) -> None:
    ids = _ids(model, 64)
    first = ExpertRouting()
    plain = _forward(model, ids, first)
    plain.logsumexp(-1).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    replayed = _forward(model, ids, ExpertRouting(replay=first.stacked(3, 2)))
    replayed.logsumexp(-1).sum().backward()
    assert torch.allclose(plain, replayed, atol=1e-6, rtol=0)
    for name, param in model.named_parameters():
        assert param.grad is not None
        assert torch.allclose(param.grad, grads[name], atol=1e-6, rtol=1e-5), name
    model.zero_grad(set_to_none=True)


def test_replayed_tokens_keep_the_routers_gradient(model: CausalLM) -> None:
    ids = _ids(model, 48)
    given = ExpertRouting()
    with torch.no_grad():
        _forward(_perturbed(model, 0.5), ids, given)
    logits = _forward(model, ids, ExpertRouting(replay=given.stacked(3, 2)))
    logits.logsumexp(-1).sum().backward()
    for layer in (0, 2):
        gate = model.model.layers[layer].mlp.gate.weight
        assert gate.grad is not None and gate.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


def test_a_row_of_negative_ids_routes_freely(model: CausalLM) -> None:
    ids = _ids(model, 32)
    own = ExpertRouting()
    with torch.no_grad():
        _forward(model, ids, own)
    replay = torch.full((32, 3, 2), -1, dtype=torch.int32)
    replay[:16] = own.stacked(3, 2)[:16].flip(-1)  # the same experts in another order
    mixed = ExpertRouting(replay=replay)
    with torch.no_grad():
        _forward(model, ids, mixed)
    assert _flips(mixed.stacked(3, 2), own.stacked(3, 2)) == 0
    assert torch.equal(mixed.chosen[0][:16], replay[:16, 0].long())


def test_a_replay_of_the_wrong_shape_or_expert_is_refused(model: CausalLM) -> None:
    ids = _ids(model, 8)
    with pytest.raises(ValueError, match="routing replay must be"):
        _forward(model, ids, ExpertRouting(replay=torch.zeros((7, 3, 2), dtype=torch.int32)))
    with pytest.raises(ValueError, match="beyond the model's 8 experts"):
        _forward(model, ids, ExpertRouting(replay=torch.full((8, 3, 2), 8, dtype=torch.int32)))


def test_the_serving_path_records_and_replays_the_same_experts(model: CausalLM) -> None:
    served = CausalLM(model.arch)
    served.load_state_dict(model.state_dict())
    block = served.model.layers[0].mlp
    assert isinstance(block, SparseMoeBlock)
    block.fuse()
    assert block._stacked is not None  # 8 experts <= 4 * 2: the batched path
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1))
    looped, batched = ExpertRouting(), ExpertRouting()
    with torch.no_grad():
        a = block(x, None, looped)
        b = block.serve(x, None, batched)
    assert torch.equal(looped.chosen[0], batched.chosen[0]) and torch.allclose(a, b, atol=1e-6)
    other = torch.randint(0, 8, (10, 1, 2))
    other[:, :, 1] = (other[:, :, 0] + 1) % 8
    replay = ExpertRouting(replay=other)
    with torch.no_grad():
        c = block.serve(x, None, replay)
        d = block(x, None, ExpertRouting(replay=other))
    assert torch.equal(replay.chosen[0], other[:, 0].long()) and torch.allclose(c, d, atol=1e-6)
