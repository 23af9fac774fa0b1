import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.rl.advantages import MemberReward, MemberStatus, group_advantages

V, P, X = MemberStatus.VALID, MemberStatus.PLACEHOLDER, MemberStatus.EXCLUDED


def test_reward_minus_mean():
    result = group_advantages(
        [MemberReward("a", V, 1.0), MemberReward("b", V, 0.0), MemberReward("c", V, 0.5)]
    )
    assert result.advantages == pytest.approx({"a": 0.5, "b": -0.5, "c": 0.0})
    assert result.metrics.reward_mean == pytest.approx(0.5)
    assert not result.metrics.zero_variance


def test_std_normalization_uses_population_std_plus_eps():
    members = [MemberReward("a", V, 1.0), MemberReward("b", V, 0.0)]
    result = group_advantages(members, normalize_std=True, eps=0.5)
    # std = 0.5, so (r - mean) / (0.5 + 0.5) = ±0.5
    assert result.advantages == pytest.approx({"a": 0.5, "b": -0.5})
    assert result.metrics.reward_std == pytest.approx(0.5)


def test_all_equal_rewards_give_zero_advantages_and_say_so():
    members = [MemberReward(str(i), V, 0.7) for i in range(4)]
    for normalize in (False, True):
        result = group_advantages(members, normalize_std=normalize)
        assert result.advantages == {str(i): 0.0 for i in range(4)}
        assert result.metrics.zero_variance
        assert result.metrics.advantage_abs_mean == 0.0


def test_placeholder_counts_with_reward_zero_whatever_its_reward():
    result = group_advantages([MemberReward("a", V, 1.0), MemberReward("p", P, 123.0)])
    assert result.advantages == pytest.approx({"a": 0.5, "p": -0.5})
    assert result.metrics.num_placeholder == 1


def test_excluded_member_gets_no_advantage_but_counts_in_the_denominator():
    members = [MemberReward("a", V, 1.0), MemberReward("b", V, 0.0), MemberReward("x", X, 50.0)]
    result = group_advantages(members)
    assert "x" not in result.advantages
    assert result.advantages == pytest.approx({"a": 0.5, "b": -0.5})
    assert result.num_members == 3
    assert (result.metrics.num_valid, result.metrics.num_placeholder, result.metrics.num_excluded) == (
        2,
        0,
        1,
    )


def test_only_excluded_members():
    result = group_advantages([MemberReward("x", X), MemberReward("y", X)])
    assert result.advantages == {}
    assert result.num_members == 2
    assert result.metrics.zero_variance


def test_placeholders_and_zero_rewards_alone_are_zero_variance():
    result = group_advantages([MemberReward("a", V, 0.0), MemberReward("p", P)])
    assert result.metrics.zero_variance
    assert result.advantages == {"a": 0.0, "p": 0.0}


@pytest.mark.parametrize(
    "members",
    [
        [MemberReward("a", V, 1.0), MemberReward("a", V, 0.0)],
        [MemberReward("a", V, math.nan)],
        [MemberReward("a", V, math.inf)],
    ],
)
def test_bad_input_is_a_value_error(members):
    with pytest.raises(ValueError):
        group_advantages(members)


def test_negative_eps_is_rejected():
    with pytest.raises(ValueError, match="eps"):
        group_advantages([MemberReward("a", V, 1.0)], eps=-1.0)


@given(
    rewards=st.lists(st.floats(-10, 10), min_size=1, max_size=16),
    statuses=st.lists(st.sampled_from([V, P, X]), min_size=16, max_size=16),
    normalize=st.booleans(),
)
def test_advantages_are_centered_over_resolved_members(rewards, statuses, normalize):
    members = [MemberReward(f"e{i}", s, r) for i, (r, s) in enumerate(zip(rewards, statuses, strict=False))]
    result = group_advantages(members, normalize_std=normalize)
    resolved = [m for m in members if m.status is not X]
    assert set(result.advantages) == {m.execution_id for m in resolved}
    assert math.fsum(result.advantages.values()) == pytest.approx(0.0, abs=1e-6)
    # ordering of advantages follows ordering of effective rewards
    effective = {m.execution_id: (m.reward if m.status is V else 0.0) for m in resolved}
    for a in resolved:
        for b in resolved:
            if effective[a.execution_id] > effective[b.execution_id]:
                assert result.advantages[a.execution_id] >= result.advantages[b.execution_id]
