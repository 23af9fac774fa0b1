"""A micro-step against the packing the audit recomputes (app/audit/microsteps.py `compare_execution`):
micro-steps the packer's own code built from simulated executions compare clean, and each doctored field
is named."""

import dataclasses

import numpy as np
import pytest

from app.audit.microsteps import ExpectedMember, compare_execution
from app.audit.recompute import admit_paths, expected_rows
from gyre.rl.microstep import MicroStep
from gyre.rl.packing import pack
from gyre.trajectory import admit, materialize
from tests.unit.rl.helpers import BRANCHING
from tests.unit.trajectory.harness_sim import run_script

BN = 8
ADVANTAGES = {"exec-0": 0.75, "exec-1": -0.25, "exec-2": -0.5}


def packed(layout: str = "tree") -> tuple[MicroStep, dict[str, ExpectedMember]]:
    """One micro-step of three simulated executions as the packer builds it, and the audit's expectation."""
    rows, expected = [], {}
    for seed in range(3):
        tree = run_script(seed, BRANCHING).tree
        rows += materialize(tree, admit(tree, j_max=3, seed=seed), layout)  # type: ignore[arg-type]
        mine = expected_rows(tree, admit_paths(tree, j_max=3, seed=seed), row_layout=layout)
        expected[tree.execution_id] = ExpectedMember("g1", 0, "valid", ADVANTAGES[tree.execution_id], mine)
    (step,) = pack(rows, ADVANTAGES, num_batch_executions=BN, token_budget=10**6)
    return step, expected


def defects(step: MicroStep, expected: dict[str, ExpectedMember]) -> list[str]:
    return [d for i, e in enumerate(step.execution_ids) for d in compare_execution(step, i, expected[e], BN)]


@pytest.mark.parametrize("layout", ["paths", "tree"])
def test_the_packers_microstep_matches_the_recomputation(layout):
    step, expected = packed(layout)
    assert (step.tree is not None) == (layout == "tree") and step.num_executions == 3
    assert defects(step, expected) == []


def test_a_changed_advantage_is_named():
    step, expected = packed()
    advantages = step.advantages.copy()
    advantages[1] += 0.125
    found = defects(dataclasses.replace(step, advantages=advantages), expected)
    assert found == [
        f"advantages: {float(advantages[1])!r} recorded, {ADVANTAGES[step.execution_ids[1]]!r} recomputed "
        "from the evaluator's rewards"
    ]


def test_a_wrong_coefficient_is_named():
    step, expected = packed()
    found = defects(dataclasses.replace(step, coefficients=step.coefficients * (BN / (BN - 1))), expected)
    assert len(found) == 3 and all(d.startswith("coefficients: ") and f"·{BN}) = " in d for d in found), found


def _with_mask(step: MicroStep, mask: np.ndarray) -> MicroStep:
    """The micro-step with another target mask, every dependent field made consistent with it (as a
    doctored record would be, so that only the comparison can tell)."""
    counts = np.bincount(step.execution_index[mask], minlength=step.num_executions).astype(np.int32)
    per_execution = np.array(
        [step.coefficients[step.target_mask & (step.execution_index == i)][0] for i in range(3)]
    )
    return dataclasses.replace(
        step,
        target_mask=mask,
        execution_num_targets=counts,
        coefficients=np.where(mask, per_execution[step.execution_index], 0.0),
        behaviour_logprobs=np.where(
            mask, np.where(step.target_mask, step.behaviour_logprobs, -1.0), 0.0
        ).astype(np.float32),
        behaviour_versions=np.where(mask, 3, -1).astype(np.int32),
    )


def test_a_target_the_engine_did_not_sample_is_named():
    step, expected = packed()
    eid = step.execution_ids[2]
    row = next(r for r in expected[eid].rows if (~r.sampled[1:]).any())
    # a prompt or tool token (not sampled) of that execution's row, past the row's first token
    start = int(step.cu_seqlens[list(step.row_execution).index(2) + expected[eid].rows.index(row)])
    k = 1 + int(np.flatnonzero(~row.sampled[1:])[0])
    mask = step.target_mask.copy()
    mask[start + k] = True
    found = defects(_with_mask(step, mask), expected)
    assert any(
        "target_mask: admits 1 token(s) the engine did not sample" in d and f"first at token {k})" in d
        for d in found
    ), found
    assert any(d.startswith("execution_num_targets: ") for d in found), found


def test_a_target_left_out_is_named():
    step, expected = packed()
    mask = step.target_mask.copy()
    mask[np.flatnonzero(mask & (step.execution_index == 0))[-1]] = False
    found = defects(_with_mask(step, mask), expected)
    assert any(d.startswith("row ") and "target_mask: leaves out 1 admitted target(s)" in d for d in found), (
        found
    )


def test_other_tokens_a_wrong_layout_and_a_member_that_has_no_rows_are_named():
    step, expected = packed()
    ids = step.input_ids.copy()
    ids[5] += 1
    assert "row 0: input_ids: differ from the tree's at token 5" in defects(
        dataclasses.replace(step, input_ids=ids), expected
    )
    paths, _ = packed("paths")
    assert any(d.startswith(("rows: ", "row 0: length: ")) for d in defects(paths, expected))
    placeholder = dataclasses.replace(expected[step.execution_ids[0]], status="placeholder", rows=[])
    found = compare_execution(step, 0, placeholder, BN)
    assert found == ["it is resolved placeholder: it has no trainable rows, yet the micro-step trains it"]
