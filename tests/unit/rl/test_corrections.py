import dataclasses
import math
from typing import get_args

import numpy as np
import pytest
import torch

from gyre.config.training import ObjectiveSection, TokenCorrectionName
from gyre.rl.corrections import TOKEN_CORRECTIONS
from gyre.rl.loss import ObjectiveParams, gspo_loss
from gyre.rl.packing import pack
from gyre.rl.step_loss import train_microstep
from tests.unit.rl.helpers import TinyLM, random_batch
from tests.unit.rl.test_step_loss import flat_grad, gradient_of, oversize_execution

F64 = torch.float64

MIS = ObjectiveParams(token_correction="mis")
ICEPOP = ObjectiveParams(token_correction="icepop")
SEQUENCE = ObjectiveParams(sequence_mask=True)

# bands tight enough that the random batches' noise (σ = 0.02 in log ρ) trips each of them
TIGHT = {
    "mis": ObjectiveParams(token_correction="mis", mis_low=0.98, mis_high=1.02),
    "icepop": ObjectiveParams(token_correction="icepop", icepop_low=0.98, icepop_high=1.02),
    "sequence": ObjectiveParams(sequence_mask=True, sequence_mask_low=0.995, sequence_mask_high=1.005),
    "all": ObjectiveParams(
        token_correction="icepop",
        icepop_low=0.98,
        icepop_high=1.02,
        sequence_mask=True,
        sequence_mask_low=0.995,
        sequence_mask_high=1.005,
    ),
}


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def run(logprobs, behaviour, advantages, index, coefficients, **kwargs):
    lp = t(logprobs).requires_grad_(True)
    loss, metrics = gspo_loss(
        lp, t(behaviour), t(advantages), t(index, torch.int64), t(coefficients), **kwargs
    )
    grad = torch.autograd.grad(loss, lp)[0] if loss.requires_grad else torch.zeros_like(lp)
    return loss.detach(), metrics, grad


def paper_loss(logprobs, behaviour, advantages, index, coefficients):
    """The paper's objective as the loss computed it before the corrections existed (the reference)."""
    log_ratio = logprobs.detach() - behaviour
    sums = torch.zeros(advantages.shape[0], dtype=F64).index_add_(0, index, log_ratio.double())
    counts = torch.zeros(advantages.shape[0], dtype=torch.int64).index_add_(0, index, torch.ones_like(index))
    log_s = sums / counts.clamp(min=1).double()
    over = (advantages > 0) & (log_s > math.log(1.005))
    under = (advantages < 0) & (log_s < math.log(0.995))
    keep = ~(over | under)
    weight = torch.exp(log_ratio).clamp(max=5.0)
    raw = -(keep[index].to(logprobs.dtype) * weight * advantages[index]) * logprobs
    return (coefficients * raw.clamp(max=100.0)).sum()


def test_config_names_the_registered_corrections():
    assert set(get_args(TokenCorrectionName)) == set(TOKEN_CORRECTIONS)
    assert ObjectiveParams(**ObjectiveSection().model_dump()) == ObjectiveParams()


def test_defaults_reproduce_the_paper_loss_bit_for_bit():
    seen = {"clipped": 0, "kept": 0, "ratio_capped": 0, "loss_capped": 0}
    for seed in range(8):
        gen = torch.Generator().manual_seed(seed)
        num_targets, num_executions = 40, 6
        logprobs = -torch.rand(num_targets, generator=gen, dtype=F64) * 8
        behaviour = logprobs + torch.randn(num_targets, generator=gen, dtype=F64)
        advantages = torch.randn(num_executions, generator=gen, dtype=F64) * 20
        index = torch.randint(0, num_executions, (num_targets,), generator=gen)
        coefficients = torch.rand(num_targets, generator=gen, dtype=F64)
        lp = logprobs.clone().requires_grad_(True)
        expected = paper_loss(lp, behaviour, advantages, index, coefficients)
        (expected_grad,) = torch.autograd.grad(expected, lp)
        # bands of the inactive corrections are ignored
        for objective in (
            ObjectiveParams(),
            ObjectiveParams(mis_high=1.5, icepop_low=0.9, sequence_mask_low=0.5),
        ):
            lp = logprobs.clone().requires_grad_(True)
            loss, metrics = gspo_loss(lp, behaviour, advantages, index, coefficients, objective=objective)
            (grad,) = torch.autograd.grad(loss, lp)
            assert torch.equal(loss.detach(), expected.detach())
            assert torch.equal(grad, expected_grad)
            assert metrics.num_token_masked_tokens == metrics.num_sequence_masked_executions == 0
        seen["clipped"] += metrics.num_clipped_executions
        seen["kept"] += metrics.num_executions - metrics.num_clipped_executions
        seen["ratio_capped"] += metrics.num_ratio_capped_tokens
        seen["loss_capped"] += metrics.num_loss_capped_tokens
    assert min(seen.values()) > 0, seen  # every branch of the objective was exercised


def test_mis_drops_tokens_outside_its_band_and_renormalizes_the_rest():
    # execution 0 (Â = +1, L_0 = 3): ρ = 1, 3, 0.4 → the ρ = 3 target is dropped (band [0, 2]), L'_0 = 2;
    # s_0 over the kept targets = 0.4^(1/2) < 1 with Â > 0: not clipped (with the dropped target it would
    # be 1.2^(1/3) > 1.005: clipped). Execution 1 (Â = 1, L_1 = 1): ρ = 1. B·N = 2.
    behaviour = [-1.0, -1.0, -1.0, -2.0]
    logprobs = [-1.0, -1.0 + math.log(3.0), -1.0 + math.log(0.4), -2.0]
    coefficients = [1 / 6, 1 / 6, 1 / 6, 1 / 2]
    loss, metrics, grad = run(logprobs, behaviour, [1.0, 1.0], [0, 0, 0, 1], coefficients, objective=MIS)
    # a kept target of execution 0 carries 1/(L'_0·B·N) = 1/4; its weight is sg(ρ) (uncapped under MIS)
    expected_grad = [-1 / 4 * 1.0, 0.0, -1 / 4 * 0.4, -1 / 2 * 1.0]
    assert grad.tolist() == pytest.approx(expected_grad, rel=1e-12)
    expected = -1 / 4 * (logprobs[0] + 0.4 * logprobs[2]) - 1 / 2 * logprobs[3]
    assert float(loss) == pytest.approx(expected, rel=1e-12)
    assert metrics.num_token_masked_tokens == 1
    assert metrics.summary()["token_mask_fraction"] == 0.25
    assert metrics.num_clipped_executions == 0
    _, metrics, _ = run(logprobs, behaviour, [1.0, 1.0], [0, 0, 0, 1], coefficients)
    assert metrics.num_clipped_executions == 1


def test_mis_weight_is_uncapped_inside_its_band_and_its_bounds_are_inclusive():
    # ρ = e² ≈ 7.39 > the TIS cap 5, inside [0, 10]: weight ρ, not 5
    objective = ObjectiveParams(token_correction="mis", mis_high=10.0)
    _, metrics, grad = run([-1.0], [-3.0], [-1.0], [0], [1.0], objective=objective)
    assert float(grad[0]) == pytest.approx(math.exp(2.0), rel=1e-12)
    assert metrics.num_ratio_capped_tokens == 0
    # exactly at the upper bound: kept; one ulp above: dropped (and its execution contributes nothing)
    _, metrics, grad = run([math.log(2.0)], [0.0], [-1.0], [0], [1.0], objective=MIS)
    assert metrics.num_token_masked_tokens == 0 and float(grad[0]) == pytest.approx(2.0)
    above = math.nextafter(math.log(2.0), 1.0)
    loss, metrics, grad = run([above], [0.0], [-1.0], [0], [1.0], objective=MIS)
    assert metrics.num_token_masked_tokens == 1
    assert float(loss) == 0.0 and float(grad[0]) == 0.0


def test_icepop_drops_both_tails_and_keeps_the_capped_weight():
    # one execution, Â = -1, L = 4, B·N = 1: ρ = 0.4 (below 0.5: dropped), 1, 6 (above 5: dropped), 4.9
    # the kept two carry 1/2 each; with token_ratio_cap = 2 the ρ = 4.9 target weighs 2
    rho = [0.4, 1.0, 6.0, 4.9]
    logprobs = [-1.0 + math.log(r) for r in rho]
    objective = ObjectiveParams(token_correction="icepop", token_ratio_cap=2.0)
    loss, metrics, grad = run(logprobs, [-1.0] * 4, [-1.0], [0] * 4, [1 / 4] * 4, objective=objective)
    assert grad.tolist() == pytest.approx([0.0, 1 / 2 * 1.0, 0.0, 1 / 2 * 2.0], rel=1e-12)
    assert float(loss) == pytest.approx(1 / 2 * (logprobs[1] + 2.0 * logprobs[3]), rel=1e-12)
    assert metrics.num_token_masked_tokens == 2
    # the default TIS keeps all four, with weights min(ρ, 2) and 1/L = 1/4
    _, _, grad = run(
        logprobs, [-1.0] * 4, [-1.0], [0] * 4, [1 / 4] * 4, objective=ObjectiveParams(token_ratio_cap=2.0)
    )
    assert grad.tolist() == pytest.approx([0.1, 0.25, 0.5, 0.5], rel=1e-12)


def test_sequence_mask_drops_whole_executions_by_their_geometric_mean():
    # execution 0 (Â = -1): log ρ = 0.01, 0.03 → s_0 = e^0.02 > 1.01: dropped (the GSPO clip would keep it:
    # Â < 0 is clipped only below). Execution 1 (Â = +1): log ρ = -0.005 → s_1 inside [0.99, 1.01]: kept.
    logprobs = [-1.0, -2.0, -0.5]
    behaviour = [-1.01, -2.03, -0.495]
    coefficients = [1 / 6, 1 / 6, 1 / 3]
    _, metrics, grad = run(logprobs, behaviour, [-1.0, 1.0], [0, 0, 1], coefficients, objective=SEQUENCE)
    assert grad[:2].tolist() == [0.0, 0.0]
    assert float(grad[2]) == pytest.approx(-1 / 3 * math.exp(-0.005), rel=1e-9)  # its 1/L_1 unchanged
    assert (metrics.num_sequence_masked_executions, metrics.num_sequence_masked_tokens) == (1, 2)
    assert metrics.num_clipped_executions == 0
    summary = metrics.summary()
    assert summary["sequence_mask_fraction_executions"] == 0.5
    assert summary["sequence_mask_fraction_tokens"] == pytest.approx(2 / 3)
    _, metrics, grad = run(logprobs, behaviour, [-1.0, 1.0], [0, 0, 1], coefficients)
    assert float(grad[0]) != 0.0 and metrics.num_sequence_masked_executions == 0


@pytest.mark.parametrize(
    "objective", [ObjectiveParams(token_correction="mis", mis_low=0.1), ICEPOP], ids=["mis", "icepop"]
)
def test_a_dropped_target_is_as_if_it_had_never_been_admitted(objective):
    # execution 0 has five targets, two outside both bands; B·N = 3. Dropping them must give the loss
    # and gradient of the same batch without them, whose packer would have given 1/(3·3): the
    # dropped targets leave the normalizer and the sequence ratio (with them s_0 < 0.995 and Â_0 < 0
    # would clip the execution).
    rho = [1.0, 8.0, 1.3, 0.01, 0.9]
    logprobs = [-1.0 + math.log(r) for r in rho] + [-0.7]
    behaviour = [-1.0] * 5 + [-0.7]
    advantages = [-0.8, 0.3]
    loss, metrics, grad = run(
        logprobs, behaviour, advantages, [0] * 5 + [1], [1 / 15] * 5 + [1 / 3], objective=objective
    )
    assert metrics.num_token_masked_tokens == 2
    kept = [0, 2, 4, 5]
    ref_loss, _, ref_grad = run(
        [logprobs[k] for k in kept],
        [behaviour[k] for k in kept],
        advantages,
        [0, 0, 0, 1],
        [1 / 9] * 3 + [1 / 3],
        objective=objective,
    )
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-12)
    assert [float(grad[k]) for k in kept] == pytest.approx(ref_grad.tolist(), rel=1e-12)
    assert float(grad[1]) == float(grad[3]) == 0.0


def test_an_execution_with_every_target_dropped_contributes_zero():
    loss, metrics, grad = run(
        [-1.0 + math.log(9.0)] * 2, [-1.0] * 2, [1.0], [0, 0], [0.5, 0.5], objective=MIS
    )
    assert float(loss) == 0.0 and grad.tolist() == [0.0, 0.0]
    assert metrics.num_token_masked_tokens == 2 and not math.isnan(float(loss))


def test_normalizer_scale_override_must_cover_the_executions():
    lp = t([-1.0]).requires_grad_(True)
    with pytest.raises(ValueError, match="normalizer_scale"):
        gspo_loss(
            lp,
            t([-1.0]),
            t([1.0]),
            t([0], torch.int64),
            t([1.0]),
            objective=MIS,
            normalizer_scale=t([1.0, 1.0]),
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"token_correction": "ppo"}, "token_correction"),
        ({"mis_high": 0.9}, "mis_low <= 1 <= mis_high"),
        ({"icepop_low": 0.0}, "icepop_low"),
        ({"sequence_mask_low": 1.2}, "sequence_mask_low"),
        ({"mismatch_bound": 0.0}, "mismatch_bound"),
    ],
)
def test_bad_bands_are_refused_with_the_fix_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ObjectiveParams(**kwargs)
    if "token_correction" not in kwargs:
        with pytest.raises(ValueError, match=message):
            ObjectiveSection(**kwargs)


@pytest.mark.parametrize("name", sorted(TIGHT))
@pytest.mark.parametrize(("seed", "budget", "num_cells"), [(1, 40, 2), (2, 90, 3), (3, 25, 1)])
def test_any_split_into_microsteps_and_cells_sums_to_the_batch_gradient(name, seed, budget, num_cells):
    objective = TIGHT[name]
    model = TinyLM(dtype=F64, seed=0)
    rows, advantages, bn = random_batch(np.random.default_rng(seed), model, num_groups=4)
    (whole,) = pack(rows, advantages, num_batch_executions=bn, token_budget=10**6)
    reference, reference_metrics = gradient_of([whole], model, objective=objective)
    paper, _ = gradient_of([whole], model)
    assert not torch.allclose(reference, paper)  # the correction changed the gradient
    dropped = reference_metrics.num_token_masked_tokens + reference_metrics.num_sequence_masked_tokens
    assert 0 < dropped < reference_metrics.num_targets

    steps = pack(rows, advantages, num_batch_executions=bn, token_budget=budget)
    assert len(steps) > 1
    total = torch.zeros_like(reference)
    merged = None
    for cell in range(num_cells):
        grad, metrics = gradient_of(steps[cell::num_cells], model, objective=objective)
        total += grad
        if metrics is not None:
            merged = metrics if merged is None else merged.merge(metrics)
    assert float((total - reference).abs().max()) <= 1e-12
    for key, value in reference_metrics.summary().items():
        assert merged.summary()[key] == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), key


@pytest.mark.parametrize("name", sorted(TIGHT))
@pytest.mark.parametrize("chunk_tokens", [1, 13, 25])
def test_chunked_execution_decides_its_masks_over_all_its_targets(name, chunk_tokens):
    objective = TIGHT[name]
    model = TinyLM(dtype=F64, seed=0)
    # log ρ = +0.015 on the first two rows, -0.015 on the last two: a token band [0.98, 1.0] drops the
    # first half; s_i = 1 keeps the execution, though its first rows alone would leave [0.995, 1.005]
    objective = dataclasses.replace(objective, mis_low=0.98, mis_high=1.0, icepop_low=0.98, icepop_high=1.0)
    (step,) = pack(
        oversize_execution(model, 0.015), {"big": -0.7}, num_batch_executions=4, token_budget=10**6
    )
    one_pass, one_metrics = gradient_of([step], model, objective=objective)
    model.zero_grad(set_to_none=True)
    result = train_microstep(step, model, objective=objective, chunk_tokens=chunk_tokens)
    assert result.num_chunks > 1
    assert float((flat_grad(model) - one_pass).abs().max()) <= 1e-12
    for key, value in one_metrics.summary().items():
        assert result.metrics.summary()[key] == pytest.approx(value, rel=1e-9, nan_ok=True), key


def test_mismatch_is_measured_on_the_targets_sampled_at_the_trainers_version():
    # targets 0, 1 (execution 0) and 3 (execution 1) were sampled at the trainer's version; target 2 is
    # stale (its ratio holds the policy's drift) and stays out of the mismatch.
    log_ratio = [0.1, -0.3, 2.0, 0.05]
    behaviour = [-1.0, -1.0, -1.0, -1.0]
    logprobs = [b + r for b, r in zip(behaviour, log_ratio, strict=True)]
    on_policy = t([True, True, False, True], torch.bool)
    lp = t(logprobs).requires_grad_(True)
    objective = ObjectiveParams(mismatch_bound=0.2)
    _, metrics = gspo_loss(
        lp,
        t(behaviour),
        t([-1.0, -1.0]),
        t([0, 0, 1, 1], torch.int64),
        t([0.25] * 4),
        objective=objective,
        on_policy=on_policy,
    )
    k3 = [math.exp(r) - 1 - r for r in log_ratio]
    summary = metrics.summary()
    assert metrics.num_mismatch_targets == 3 and metrics.num_mismatch_executions == 2
    assert summary["mismatch_abs_log_ratio_mean"] == pytest.approx((0.1 + 0.3 + 0.05) / 3)
    assert summary["mismatch_abs_log_ratio_max"] == pytest.approx(0.3)
    assert summary["mismatch_kl_token_mean"] == pytest.approx((k3[0] + k3[1] + k3[3]) / 3)
    assert summary["mismatch_kl_execution_mean"] == pytest.approx((k3[0] + k3[1] + k3[3]) / 2)
    assert summary["mismatch_over_bound_fraction"] == pytest.approx(1 / 3)
    assert summary["mismatch_target_fraction"] == 0.75
    assert summary["token_kl_mean"] == pytest.approx(sum(k3) / 4)  # every target, drift included
    _, unlabelled = gspo_loss(
        lp, t(behaviour), t([-1.0, -1.0]), t([0, 0, 1, 1], torch.int64), t([0.25] * 4), objective=objective
    )
    assert unlabelled.num_mismatch_targets == 4  # without versions every target is measured


@pytest.mark.parametrize("chunk_tokens", [None, 13])
def test_a_microstep_measures_the_mismatch_on_its_own_versions_targets(chunk_tokens):
    model = TinyLM(dtype=F64, seed=0)
    (step,) = pack(
        oversize_execution(model, 0.015), {"big": -0.7}, num_batch_executions=4, token_budget=10**6, step=3
    )
    targets = np.flatnonzero(step.target_mask)
    versions = np.full(step.num_tokens, -1, np.int32)
    versions[targets] = np.where(np.arange(len(targets)) % 3 == 0, 2, 3)  # a third sampled at version 2
    fresh = dataclasses.replace(step, behaviour_versions=versions)
    model.zero_grad(set_to_none=True)
    metrics = train_microstep(fresh, model, chunk_tokens=chunk_tokens).metrics
    assert metrics.num_mismatch_targets == int((versions[targets] == 3).sum())
    assert metrics.num_mismatch_executions == 1
    # the packed rows' versions (0: the helper's) differ from step 3: nothing measured, no NaN on the wire
    model.zero_grad(set_to_none=True)
    metrics = train_microstep(step, model, chunk_tokens=chunk_tokens).metrics
    assert metrics.num_mismatch_targets == 0 and math.isnan(metrics.summary()["mismatch_kl_token_mean"])
