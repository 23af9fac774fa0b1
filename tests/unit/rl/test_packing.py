import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.rl.packing import first_fit_decreasing, pack, token_coefficient
from tests.unit.rl.helpers import VOCAB, make_row


def rows_of(rng, execution_id, lengths, target_p=0.5):
    rows = []
    for j, n in enumerate(lengths):
        targets = rng.random(n) < target_p
        targets[0] = False
        rows.append(make_row(execution_id, j, rng.integers(0, VOCAB, n), targets, -rng.random(n) * 3))
    return rows


def random_rows(seed, num_executions=8, max_rows=3, max_len=40):
    rng = np.random.default_rng(seed)
    rows, advantages = [], {}
    for e in range(num_executions):
        eid = f"e{e}"
        lengths = rng.integers(2, max_len, size=int(rng.integers(1, max_rows + 1)))
        rows.extend(rows_of(rng, eid, lengths))
        advantages[eid] = float(rng.normal())
    return rows, advantages


def test_token_coefficient():
    assert token_coefficient(4, 8) == 1 / 32
    assert token_coefficient(0, 8) == 0.0
    with pytest.raises(ValueError):
        token_coefficient(3, 0)


def test_first_fit_decreasing_places_largest_first():
    assert first_fit_decreasing([4, 8, 1, 4, 2, 1], 10) == [[1, 4], [0, 3, 2, 5]]
    assert first_fit_decreasing([15, 3], 10) == [[0], [1]]  # oversize item alone
    assert first_fit_decreasing([], 10) == []
    with pytest.raises(ValueError):
        first_fit_decreasing([1], 0)


def check_packing(rows, advantages, steps, budget, num_batch_executions):
    by_execution = {}
    for r in rows:
        by_execution.setdefault(r.execution_id, []).append(r)
    trained = {e for e, rs in by_execution.items() if sum(r.num_targets for r in rs) > 0}
    seen = []
    total_coefficient = 0.0
    for k, step in enumerate(steps):
        assert step.index == k
        seen.extend(step.execution_ids)
        if step.oversize:
            assert step.num_executions == 1
        assert step.num_tokens <= budget or step.num_executions == 1
        for i, eid in enumerate(step.execution_ids):
            expected_rows = sorted(by_execution[eid], key=lambda r: r.trajectory_index)
            row_idx = np.flatnonzero(step.row_execution == i)
            assert len(row_idx) == len(expected_rows)  # every row of the execution is here
            assert np.all(np.diff(row_idx) == 1)  # and contiguous
            for r, row in zip(row_idx, expected_rows, strict=True):
                a, b = step.cu_seqlens[r], step.cu_seqlens[r + 1]
                assert np.array_equal(step.input_ids[a:b], row.token_ids)
                assert np.array_equal(step.position_ids[a:b], np.arange(b - a))
                assert np.array_equal(step.target_mask[a:b], row.target_mask)
                assert np.array_equal(
                    step.behaviour_logprobs[a:b][row.target_mask], row.behaviour_logprobs[row.target_mask]
                )
            num_targets = sum(r.num_targets for r in expected_rows)
            assert step.execution_num_targets[i] == num_targets
            assert step.advantages[i] == advantages[eid]
            coefficients = step.coefficients[step.execution_index == i]
            mask = step.target_mask[step.execution_index == i]
            assert np.all(coefficients[mask] == 1.0 / (num_targets * num_batch_executions))
            assert np.all(coefficients[~mask] == 0.0)
            total_coefficient += float(coefficients.sum())
    assert sorted(seen) == sorted(trained)  # each trained execution exactly once
    # Σ over an execution of its coefficients is 1/(B·N)
    assert total_coefficient == pytest.approx(len(trained) / num_batch_executions, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), budget=st.integers(8, 200), num_executions=st.integers(0, 10))
def test_pack_keeps_executions_whole_under_the_budget(seed, budget, num_executions):
    rows, advantages = random_rows(seed, num_executions)
    steps = pack(rows, advantages, num_batch_executions=16, token_budget=budget, batch_id="b", step=3)
    check_packing(rows, advantages, steps, budget, 16)
    assert all(s.batch_id == "b" and s.step == 3 and s.token_budget == budget for s in steps)


def test_pack_is_independent_of_row_order():
    rows, advantages = random_rows(7, 9)
    a = pack(rows, advantages, num_batch_executions=9, token_budget=60)
    b = pack(list(reversed(rows)), advantages, num_batch_executions=9, token_budget=60)
    assert [s.execution_ids for s in a] == [s.execution_ids for s in b]
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.input_ids, y.input_ids)


def test_execution_without_targets_is_dropped():
    rng = np.random.default_rng(0)
    rows = rows_of(rng, "trained", [10, 6])
    empty = make_row("empty", 0, rng.integers(0, VOCAB, 5), np.zeros(5, bool), np.zeros(5))
    steps = pack([*rows, empty], {"trained": 1.0, "empty": -1.0}, num_batch_executions=4, token_budget=100)
    assert [s.execution_ids for s in steps] == [("trained",)]


def test_oversize_execution_gets_its_own_microstep():
    rng = np.random.default_rng(1)
    rows = rows_of(rng, "big", [30, 30]) + rows_of(rng, "small", [5])
    steps = pack(rows, {"big": 1.0, "small": 0.5}, num_batch_executions=2, token_budget=40)
    assert [s.execution_ids for s in steps] == [("big",), ("small",)]
    assert steps[0].oversize and steps[0].num_rows == 2
    assert not steps[1].oversize


def test_rows_of_an_execution_without_advantage_are_rejected():
    rows = rows_of(np.random.default_rng(2), "excluded", [5])
    with pytest.raises(ValueError, match="no advantage"):
        pack(rows, {}, num_batch_executions=1, token_budget=10)


def test_duplicate_trajectory_index_is_rejected():
    rng = np.random.default_rng(3)
    row = rows_of(rng, "e", [5])[0]
    with pytest.raises(ValueError, match="same trajectory index"):
        pack([row, row], {"e": 1.0}, num_batch_executions=1, token_budget=10)


def test_non_finite_behaviour_logprob_is_rejected():
    targets = np.array([False, True, True])
    row = make_row("e", 0, np.array([1, 2, 3]), targets, np.array([0.0, -1.0, -np.inf]))
    with pytest.raises(ValueError, match="non-finite"):
        pack([row], {"e": 1.0}, num_batch_executions=1, token_budget=10)


def test_bad_budget_or_denominator_is_rejected():
    rows, advantages = random_rows(4, 2)
    with pytest.raises(ValueError, match="budget"):
        pack(rows, advantages, num_batch_executions=2, token_budget=0)
    with pytest.raises(ValueError, match="B·N"):
        pack(rows, advantages, num_batch_executions=0, token_budget=10)


def test_group_members_through_advantages_and_packing():
    from gyre.rl.advantages import MemberReward, MemberStatus, group_advantages

    rng = np.random.default_rng(5)
    members = [
        MemberReward("a", MemberStatus.VALID, 1.0),
        MemberReward("b", MemberStatus.VALID, 0.0),
        MemberReward("p", MemberStatus.PLACEHOLDER),
        MemberReward("x", MemberStatus.EXCLUDED),
    ]
    group = group_advantages(members)
    rows = rows_of(rng, "a", [12, 7]) + rows_of(rng, "b", [9])
    (step,) = pack(rows, group.advantages, num_batch_executions=group.num_members, token_budget=100)
    # the placeholder has an advantage but no rows, so it adds nothing; the excluded member still
    # counts in B·N = 4: each execution's coefficients sum to 1/4, not 1/3
    assert step.execution_ids == ("a", "b")
    for i in range(2):
        assert step.coefficients[step.execution_index == i].sum() == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="no advantage"):
        pack(rows_of(rng, "x", [5]), group.advantages, num_batch_executions=4, token_budget=100)
