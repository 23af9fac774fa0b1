"""The audit's own objective (app/audit/objective.py): hand-computed cases of each term of docs/method.md's
formula and of each correction, agreement with the trainer's loss (gyre/rl/loss.py) on random inputs, the
micro-step form over a packed model, and its independence from the trainer's loss code."""

import dataclasses
import math

import grimp
import numpy as np
import pytest
import torch

from app.audit.objective import Mismatch, ObjectiveSpec, microstep_objective, objective_loss
from gyre.rl.loss import ObjectiveParams, gspo_loss
from gyre.rl.microstep import row_chunks
from gyre.rl.packing import pack
from gyre.rl.step_loss import microstep_loss
from tests.unit.rl.helpers import TinyLM, logprobs_alone, make_row, simulated_rows

F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


DEFAULT = ObjectiveSpec()


def run(logprobs, behaviour, advantages, index, coefficients, spec=DEFAULT):
    lp = t(logprobs).requires_grad_(True)
    loss = objective_loss(lp, t(behaviour), t(advantages), t(index, torch.int64), t(coefficients), spec)
    grad = torch.autograd.grad(loss, lp, allow_unused=True)[0] if loss.requires_grad else None
    return float(loss.detach()), (torch.zeros_like(lp) if grad is None else grad).tolist()


def test_the_formula_on_a_hand_computed_example():
    # execution 0: Â = +1, log ρ = (0.001, −0.001): s = 1, kept; execution 1: Â = −0.5, log ρ = 0.002:
    # s > 1, kept (only s < 0.995 clips a negative advantage)
    logprobs, behaviour = [-1.0, -2.0, -0.5], [-1.001, -1.999, -0.502]
    coefficients, adv = [1 / 4, 1 / 4, 1 / 2], [1.0, 1.0, -0.5]
    loss, grad = run(logprobs, behaviour, [1.0, -0.5], [0, 0, 1], coefficients)
    rho = [math.exp(a - b) for a, b in zip(logprobs, behaviour, strict=True)]
    assert loss == pytest.approx(
        sum(-c * r * a * lp for c, r, a, lp in zip(coefficients, rho, adv, logprobs, strict=True)), rel=1e-12
    )
    assert grad == pytest.approx(
        [-c * r * a for c, r, a in zip(coefficients, rho, adv, strict=True)], rel=1e-12
    )


@pytest.mark.parametrize(
    ("advantage", "log_rho", "kept"),
    [
        (1.0, 0.01, False),  # s = e^0.01 > 1.005 pushes up: clipped
        (-1.0, -0.01, False),  # s < 0.995 pushes down: clipped
        (1.0, -0.01, True),  # a positive advantage is clipped above only
        (-1.0, 0.01, True),
        (1.0, math.log(1.005), True),  # exactly on the bound: kept
        (1.0, math.nextafter(math.log(1.005), 1.0), False),
        (-1.0, math.log(0.995), True),
    ],
)
def test_the_clip_of_one_execution(advantage, log_rho, kept):
    loss, grad = run([log_rho], [0.0], [advantage], [0], [0.5])
    expected = -0.5 * math.exp(log_rho) * advantage if kept else 0.0
    assert grad == pytest.approx([expected], rel=1e-12, abs=0.0)
    assert loss == pytest.approx(expected * log_rho, rel=1e-12, abs=0.0)


def test_the_token_weight_is_capped_and_carries_no_gradient():
    # ρ = 8 > cap 5; Â < 0 so the high s does not clip: w = 5, ℓ = −5·(−1)·log π = 5 log π
    loss, grad = run([-1.0], [-1.0 - math.log(8.0)], [-1.0], [0], [0.25])
    assert loss == pytest.approx(0.25 * 5.0 * -1.0, rel=1e-12)
    assert grad == pytest.approx([0.25 * 5.0], rel=1e-12)


def test_the_token_loss_is_capped():
    # ℓ = −1·1·(−200) = 200 > 100: the token contributes c·100 and no gradient
    loss, grad = run([-200.0, -1.0], [-200.0, -1.0], [1.0], [0, 0], [0.5, 0.5])
    assert loss == pytest.approx(0.5 * 100.0 + 0.5 * 1.0, rel=1e-12)
    assert grad == pytest.approx([0.0, -0.5], rel=1e-12, abs=0.0)


def test_mis_drops_a_target_outside_its_band_and_rescales_the_rest_uncapped():
    # ρ = (1.8, 3, 1); mis band [0, 2] drops ρ = 3: L = 3, L' = 2, the kept weigh 3/2 each; w = ρ (cap 1.5
    # would bind under tis); Â = −1 and s over the kept = √1.8 > 0.995: not clipped
    spec = ObjectiveSpec(token_correction="mis", token_ratio_cap=1.5)
    lps = [-1.0, -2.0, -3.0]
    behaviour = [lps[0] - math.log(1.8), lps[1] - math.log(3.0), lps[2]]
    loss, grad = run(lps, behaviour, [-1.0], [0, 0, 0], [0.1] * 3, spec)
    assert grad == pytest.approx([0.1 * 1.5 * 1.8, 0.0, 0.1 * 1.5], rel=1e-12, abs=0.0)
    assert loss == pytest.approx(0.1 * 1.5 * (1.8 * lps[0] + lps[2]), rel=1e-12)
    tis, _ = run(
        lps, behaviour, [-1.0], [0, 0, 0], [0.1] * 3, dataclasses.replace(spec, token_correction="tis")
    )
    assert tis == pytest.approx(0.1 * (1.5 * lps[0] + 1.5 * lps[1] + lps[2]), rel=1e-12)


def test_icepop_drops_below_its_band_and_keeps_the_capped_weight():
    spec = ObjectiveSpec(token_correction="icepop", token_ratio_cap=1.5)
    lps = [-1.0, -1.0]
    behaviour = [lps[0] - math.log(0.4), lps[1] - math.log(1.8)]  # ρ = 0.4 (dropped), 1.8 (kept, w = 1.5)
    loss, grad = run(lps, behaviour, [-1.0], [0, 0], [0.2, 0.2], spec)
    assert grad == pytest.approx([0.0, 0.2 * 2 * 1.5], rel=1e-12, abs=0.0)
    assert loss == pytest.approx(0.2 * 2 * 1.5 * lps[1], rel=1e-12)


def test_an_execution_with_every_target_dropped_contributes_nothing():
    spec = ObjectiveSpec(token_correction="icepop")
    loss, grad = run([-1.0, -1.0], [-1.0 - math.log(0.1), -1.0], [1.0, 1.0], [0, 1], [0.5, 0.5], spec)
    assert grad == pytest.approx([0.0, -0.5], rel=1e-12, abs=0.0)
    assert loss == pytest.approx(0.5, rel=1e-12)


def test_the_sequence_mask_drops_an_execution_whatever_its_advantage():
    # s = 1.02: outside [0.99, 1.01]; Â < 0, which the clip alone would keep
    loss, grad = run([math.log(1.02)], [0.0], [-1.0], [0], [1.0], ObjectiveSpec(sequence_mask=True))
    assert (loss, grad) == (0.0, [0.0])
    assert run([math.log(1.02)], [0.0], [-1.0], [0], [1.0])[1] == pytest.approx([1.02], rel=1e-12)


def test_the_spec_comes_from_the_config_section_and_refuses_an_unknown_correction():
    from gyre.config.training import ObjectiveSection

    section = ObjectiveSection(token_correction="icepop", icepop_low=0.25, sequence_mask=True)
    spec = ObjectiveSpec.of(section)
    assert (spec.token_correction, spec.icepop_low, spec.sequence_mask, spec.clip_high) == (
        "icepop",
        0.25,
        True,
        1.005,
    )
    with pytest.raises(ValueError, match="token_correction 'gmis' is not tis, mis or icepop"):
        ObjectiveSpec(token_correction="gmis")


CONFIGS = [
    {},
    {"token_correction": "mis", "mis_high": 1.2},
    {"token_correction": "icepop", "icepop_low": 0.9, "icepop_high": 1.1, "token_ratio_cap": 1.05},
    {"sequence_mask": True, "sequence_mask_low": 0.95, "sequence_mask_high": 1.05},
    {"token_correction": "mis", "mis_low": 0.85, "mis_high": 1.15, "sequence_mask": True},
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", range(4))
def test_it_agrees_with_the_trainers_loss_on_random_targets(config, seed):
    """Two implementations written apart agree where both are right (which is what the audit relies on)."""
    gen = torch.Generator().manual_seed(seed)
    num_targets, num_executions = 60, 7
    logprobs = -torch.rand(num_targets, generator=gen, dtype=F64) * 4
    behaviour = logprobs + torch.randn(num_targets, generator=gen, dtype=F64) * 0.15
    advantages = torch.randn(num_executions, generator=gen, dtype=F64)
    index = torch.randint(0, num_executions, (num_targets,), generator=gen)
    coefficients = 1.0 / (torch.bincount(index, minlength=num_executions)[index].double() * 32)
    x, y = logprobs.clone().requires_grad_(True), logprobs.clone().requires_grad_(True)
    theirs, _ = gspo_loss(x, behaviour, advantages, index, coefficients, objective=ObjectiveParams(**config))
    mine = objective_loss(y, behaviour, advantages, index, coefficients, ObjectiveSpec(**config))
    theirs.backward()
    mine.backward()
    assert float(mine.detach()) == pytest.approx(float(theirs.detach()), rel=1e-12, abs=1e-15)
    assert torch.allclose(y.grad, x.grad, rtol=1e-12, atol=1e-15)
    assert bool((x.grad != 0).any())


def _model_gradient(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()]
    )


@pytest.mark.parametrize("layout", ["paths", "tree"])
def test_a_microsteps_loss_over_a_packed_model_any_chunking(layout):
    model = TinyLM(vocab_size=264, max_positions=4096, dtype=F64, seed=1)  # the simulated harness's ids
    rows, advantages = simulated_rows(layout, j_max=3)
    (step,) = pack(rows, advantages, num_batch_executions=12, token_budget=10**6)
    assert (step.tree is not None) == (layout == "tree") and len(row_chunks(step.cu_seqlens, 60)) > 1
    whole = microstep_objective(step, model, ObjectiveSpec())
    reference = _model_gradient(model, microstep_loss(step, model)[0])
    assert float(reference.abs().max()) > 1e-6
    assert torch.allclose(_model_gradient(model, whole), reference, rtol=1e-10, atol=1e-14)
    chunked = microstep_objective(step, model, ObjectiveSpec(), chunk_tokens=60)
    assert float(chunked.detach()) == pytest.approx(float(whole.detach()), rel=1e-12)
    assert torch.allclose(_model_gradient(model, chunked), reference, rtol=1e-10, atol=1e-14)


def test_a_microsteps_loss_is_the_formula_over_each_rows_own_logprobs():
    model = TinyLM(dtype=F64, seed=2)
    rng = np.random.default_rng(0)
    rows, behaviours = [], []
    for k, eid in enumerate(("a", "b")):
        tokens = rng.integers(0, 24, size=9)
        targets = np.arange(9) >= 4
        behaviour = logprobs_alone(model, tokens) + 0.001 * (k + 1)
        rows.append(make_row(eid, 0, tokens, targets, behaviour))
        behaviours.append((tokens, targets, behaviour))
    (step,) = pack(rows, {"a": 0.5, "b": -0.5}, num_batch_executions=4, token_budget=100)
    loss = float(microstep_objective(step, model, ObjectiveSpec()).detach())
    expected = 0.0
    for (tokens, targets, behaviour), adv in zip(behaviours, (0.5, -0.5), strict=True):
        own = logprobs_alone(model, tokens)[targets]
        rho = np.exp(own - np.float32(behaviour[targets]).astype(np.float64))
        assert np.exp(np.log(rho).mean()) == pytest.approx(1.0, abs=0.005)  # inside the clip
        expected += float(np.sum(1 / (5 * 4) * -(rho * adv * own)))
    assert loss == pytest.approx(expected, rel=1e-9)


def test_the_objective_imports_none_of_the_trainers_loss_code():
    graph = grimp.build_graph("gyre", "app", "services", cache_dir=None)
    forbidden = (
        "gyre.rl.loss",
        "gyre.rl.loss_metrics",
        "gyre.rl.corrections",
        "gyre.rl.step_loss",
        "gyre.trainer",
    )
    imported = graph.find_upstream_modules("app.audit.objective")
    assert sorted(m for m in imported if m.startswith(forbidden)) == []
    assert "gyre.rl.loss" in graph.find_upstream_modules("app.audit.replay")  # the graph sees such imports


def test_the_mismatch_of_a_step_by_hand() -> None:
    """d = log π_θ − log p_roll per on-policy target: |d| mean and max, and k3 = e^d − 1 − d."""
    seen = Mismatch()
    seen.add(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0]))  # d = 0.5, 0
    seen.add(torch.tensor([]), torch.tensor([]))  # a micro-step without on-policy targets adds nothing
    seen.add(torch.tensor([-3.0]), torch.tensor([-2.0]))  # d = -1
    got = seen.to_json()
    assert got["tokens"] == 3 and got["max_abs"] == 1.0
    assert got["mean_abs"] == pytest.approx(0.5, abs=1e-12)
    k3 = (math.exp(0.5) - 1 - 0.5) + 0.0 + (math.exp(-1.0) - 1 + 1.0)
    assert got["k3_kl_token_mean"] == pytest.approx(k3 / 3, abs=1e-12)
    assert Mismatch().to_json() == {"tokens": 0, "mean_abs": None, "max_abs": None, "k3_kl_token_mean": None}
