"""The audit's per-step clip and mask fractions of each correction (app/audit/corrections.py): hand-computed
cases, agreement with the trainer's metrics (gyre/rl/loss.py) on random targets, the comparison with a
trainer's logged row (a doctored row is a defect, a decision within the border is not), and its independence
from the trainer's loss code."""

import math

import grimp
import pytest
import torch

from app.audit.corrections import Counts, StepCorrections, border_log, variants
from app.audit.objective import Mismatch, ObjectiveSpec
from gyre.rl.loss import ObjectiveParams, gspo_loss

F64 = torch.float64


DEFAULT = ObjectiveSpec()


def counts(log_rho, index, advantages, spec=DEFAULT, border=0.0):
    c = Counts()
    c.add(
        torch.tensor(log_rho, dtype=F64),
        torch.tensor(index),
        torch.tensor(advantages, dtype=F64),
        spec,
        border,
    )
    return c


def test_tis_masks_nothing_and_clips_by_the_sequence_ratio_of_every_target():
    # execution 0: Â > 0, log s = 0.01 > log 1.005: clipped; execution 1: Â < 0, s > 1: kept; ρ = 8 > cap 5
    c = counts([0.01, 0.01, math.log(8.0), -math.log(8.0)], [0, 0, 1, 1], [1.0, -1.0])
    assert (c.targets, c.executions, c.token_masked) == (4, 2, 0)
    assert (c.clipped_executions, c.sequence_masked_executions, c.token_capped) == (1, 0, 1)
    assert c.fractions() == {
        "token_mask_fraction": 0.0,
        "token_capped_fraction": 0.25,
        "clip_fraction": 0.5,
        "sequence_mask_fraction": 0.0,
    }


def test_icepop_drops_outside_its_band_and_the_clip_reads_the_kept_targets():
    # ρ = (0.4, 1.02): icepop [0.5, 5] drops 0.4; s over the kept = 1.02 > 1.005 with Â > 0: clipped.
    # Under tis, s = √(0.4·1.02) < 1: the same execution is not clipped
    log_rho = [math.log(0.4), math.log(1.02)]
    icepop = counts(log_rho, [0, 0], [1.0], ObjectiveSpec(token_correction="icepop"))
    assert (icepop.token_masked, icepop.clipped_executions) == (1, 1)
    tis = counts(log_rho, [0, 0], [1.0])
    assert (tis.token_masked, tis.clipped_executions) == (0, 0)


def test_mis_drops_outside_its_band_and_caps_nothing():
    spec = ObjectiveSpec(token_correction="mis", mis_low=0.9, mis_high=2.0)
    c = counts([math.log(3.0), math.log(0.8), 0.0, math.log(6.0)], [0, 0, 0, 1], [-1.0, -1.0], spec)
    assert (c.token_masked, c.token_capped) == (3, 0)  # ρ = 3, 0.8, 6 leave [0.9, 2]; mis weighs uncapped
    # execution 1 lost its only target: counted, but neither clipped nor sequence-masked
    assert (c.executions, c.clipped_executions) == (2, 0)


def test_the_sequence_mask_drops_an_execution_whatever_its_advantage():
    spec = ObjectiveSpec(sequence_mask=True)
    c = counts([math.log(1.02), 0.0, math.log(0.98)], [0, 1, 2], [-1.0, 1.0, 1.0], spec)
    assert (c.sequence_masked_executions, c.clipped_executions) == (
        2,
        0,
    )  # s = 1.02 and 0.98 leave [0.99, 1.01]
    assert c.fractions()["sequence_mask_fraction"] == pytest.approx(2 / 3)


def test_a_bound_is_inclusive_and_a_decision_near_it_is_borderline():
    spec = ObjectiveSpec(token_correction="icepop", icepop_low=0.5, icepop_high=2.0)
    on = counts([math.log(2.0)], [0], [-1.0], spec, border=1e-4)
    assert (on.token_masked, on.border_targets, on.border_executions) == (0, 1, 1)
    off = counts([math.log(2.0) + 1e-3], [0], [-1.0], spec, border=1e-4)
    assert (off.token_masked, off.border_targets) == (1, 0)
    near_clip = counts([math.log(1.005) - 1e-5], [0], [1.0], border=1e-4)
    assert (near_clip.clipped_executions, near_clip.border_executions) == (0, 1)


def test_a_tighter_band_masks_at_least_as_many_targets():
    gen = torch.Generator().manual_seed(0)
    log_rho = torch.randn(500, generator=gen, dtype=F64) * 0.05
    index, adv = torch.arange(500) % 25, torch.randn(25, generator=gen, dtype=F64)
    masked = []
    for width in (0.2, 0.1, 0.05, 0.01):
        c = Counts()
        c.add(
            log_rho,
            index,
            adv,
            ObjectiveSpec(token_correction="icepop", icepop_low=1 - width, icepop_high=1 + width),
            0.0,
        )
        expected = int(((log_rho < math.log(1 - width)) | (log_rho > math.log(1 + width))).sum())
        assert c.token_masked == expected
        masked.append(c.token_masked)
    assert masked == sorted(masked) and masked[-1] > masked[0]


CONFIGS = [
    {},
    {"token_correction": "mis", "mis_low": 0.9, "mis_high": 1.1},
    {"token_correction": "icepop", "icepop_low": 0.9, "icepop_high": 1.1, "token_ratio_cap": 1.05},
    {"sequence_mask": True, "sequence_mask_low": 0.97, "sequence_mask_high": 1.03},
    {"token_correction": "mis", "mis_low": 0.85, "mis_high": 1.15, "sequence_mask": True},
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", range(4))
def test_the_counts_equal_the_trainers_metrics_on_random_targets(config, seed):
    gen = torch.Generator().manual_seed(seed)
    num_targets, num_executions = 80, 9
    logprobs = -torch.rand(num_targets, generator=gen, dtype=F64) * 4
    behaviour = logprobs + torch.randn(num_targets, generator=gen, dtype=F64) * 0.1
    advantages = torch.randn(num_executions, generator=gen, dtype=F64)
    index = torch.randint(0, num_executions, (num_targets,), generator=gen)
    coefficients = torch.full((num_targets,), 0.01, dtype=F64)
    _, theirs = gspo_loss(
        logprobs, behaviour, advantages, index, coefficients, objective=ObjectiveParams(**config)
    )
    mine = counts(
        (logprobs - behaviour).tolist(), index.tolist(), advantages.tolist(), ObjectiveSpec(**config)
    )
    assert (mine.targets, mine.executions) == (theirs.num_targets, theirs.num_executions)
    assert mine.token_masked == theirs.num_token_masked_tokens
    assert mine.clipped_executions == theirs.num_clipped_executions
    assert mine.sequence_masked_executions == theirs.num_sequence_masked_executions
    assert mine.token_capped == theirs.num_ratio_capped_tokens


def test_the_variants_switch_one_correction_on_with_the_runs_bounds():
    spec = ObjectiveSpec(token_correction="icepop", icepop_low=0.9, mis_high=1.5, sequence_mask=True)
    v = variants(spec)
    assert v["run"] == spec
    assert (v["tis"].token_correction, v["tis"].sequence_mask) == ("tis", False)
    assert (v["mis"].token_correction, v["mis"].mis_high, v["mis"].sequence_mask) == ("mis", 1.5, False)
    assert (v["icepop"].token_correction, v["icepop"].icepop_low) == ("icepop", 0.9)
    assert (v["sequence_mask"].token_correction, v["sequence_mask"].sequence_mask) == ("tis", True)


def _step(spec, border=1e-4):
    """Two executions of 4 targets: Â > 0 with log ρ = 0.01 each (clipped), Â < 0 with one ρ = 0.4."""
    seen = StepCorrections(spec, border)
    log_rho = torch.tensor([0.01] * 4 + [0.0, 0.0, 0.0, math.log(0.4)], dtype=F64)
    seen.add(log_rho, torch.tensor([0] * 4 + [1] * 4), torch.tensor([1.0, -1.0], dtype=F64))
    mismatch = Mismatch()
    mismatch.add(log_rho, torch.zeros(8, dtype=F64))
    return seen, mismatch, log_rho


def _logged(mismatch, **changes):
    m = mismatch.to_json()
    row = {
        "num_target_tokens": 8,
        "clip_fraction": 0.5,
        "token_mask_fraction": 1 / 8,
        "sequence_mask_fraction": 0.0,
        "num_mismatch_targets": m["tokens"],
        "mismatch_abs_log_ratio_mean": m["mean_abs"],
        "mismatch_abs_log_ratio_max": m["max_abs"],
        "mismatch_kl": m["k3_kl_token_mean"],
    }
    return {**row, **changes}


def test_a_logged_row_that_agrees_passes_and_a_doctored_one_is_named():
    seen, mismatch, _ = _step(ObjectiveSpec(token_correction="icepop"))
    assert seen.to_json()["variants"]["run"]["token_mask_fraction"] == 1 / 8
    assert seen.compare(0, _logged(mismatch), mismatch) == []
    # the trainer's float32 log-probs differ from the audit's by rounding: the mismatch within the border
    assert (
        seen.compare(0, _logged(mismatch, mismatch_abs_log_ratio_max=mismatch.abs_max + 5e-5), mismatch) == []
    )
    (defect,) = seen.compare(0, _logged(mismatch, clip_fraction=0.0), mismatch)
    assert defect.startswith("step 0: the trainer logged clip_fraction 0") and "1/2" in defect
    (defect,) = seen.compare(0, _logged(mismatch, token_mask_fraction=0.25), mismatch)
    assert "token_mask_fraction 0.25" in defect and "1/8" in defect
    (defect,) = seen.compare(0, _logged(mismatch, num_target_tokens=9), mismatch)
    assert "9 targets, the micro-steps hold 8" in defect
    (defect,) = seen.compare(0, _logged(mismatch, mismatch_kl=2 * mismatch.k3_sum / 8), mismatch)
    assert "mismatch_kl" in defect
    (defect,) = seen.compare(0, _logged(mismatch, num_mismatch_targets=3), mismatch)
    assert "over 3 on-policy targets, the micro-steps hold 8" in defect


def test_a_decision_within_the_border_may_go_either_way():
    # the clipped execution's log s sits 1e-5 over log 1.005: a float32 trainer may have kept it
    spec = ObjectiveSpec()
    seen = StepCorrections(spec, border=1e-4)
    seen.add(
        torch.tensor([math.log(1.005) + 1e-5] * 2, dtype=F64),
        torch.tensor([0, 0]),
        torch.tensor([1.0], dtype=F64),
    )
    mismatch = Mismatch()
    row = {"num_target_tokens": 2, "clip_fraction": 0.0, "num_mismatch_targets": 0}
    assert seen.to_json()["border_executions"] == 1
    assert seen.compare(3, row, mismatch) == []
    strict = StepCorrections(spec, border=1e-7)
    strict.add(
        torch.tensor([math.log(1.005) + 1e-5] * 2, dtype=F64),
        torch.tensor([0, 0]),
        torch.tensor([1.0], dtype=F64),
    )
    assert [d.split(",")[0] for d in strict.compare(3, row, mismatch)] == [
        "step 3: the trainer logged clip_fraction 0"
    ]


def test_the_border_is_a_thousand_epsilon_of_the_trainers_dtype():
    assert border_log("float32") == pytest.approx(1000 * 2.0**-23)
    assert border_log("float64") < 1e-12 < border_log("bfloat16")


def test_the_corrections_import_none_of_the_trainers_loss_code():
    graph = grimp.build_graph("gyre", "app", "services", cache_dir=None)
    forbidden = (
        "gyre.rl.loss",
        "gyre.rl.loss_metrics",
        "gyre.rl.corrections",
        "gyre.rl.step_loss",
        "gyre.trainer",
    )
    imported = graph.find_upstream_modules("app.audit.corrections")
    assert sorted(m for m in imported if m.startswith(forbidden)) == []
