"""Group-relative advantages: the reward of each resolved member of a group minus the group mean,
optionally divided by the group's reward std (+eps). No value function is learned.

Who counts (docs/design.md "Outcomes"):

- `valid`: scored by the evaluator (also after a timeout); its reward counts and it gets an advantage.
- `placeholder`: a total failure with nothing to evaluate; it counts with reward 0 (whatever reward
  is given) and gets an advantage, but it carries no trainable tokens, so it adds no loss.
- `excluded`: the evaluator ran out of budget; it gets no advantage and no trajectories, yet it still
  counts in the B·N denominator of the batch loss (see `num_members`).

A group whose resolved rewards are all equal carries no learning signal: every advantage is 0 and
`AdvantageMetrics.zero_variance` says so.

    result = group_advantages(members, normalize_std=True, eps=1e-6)
    result.advantages["exec-3"]        # float
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class MemberStatus(StrEnum):
    """How a member's outcome was resolved."""

    VALID = "valid"
    PLACEHOLDER = "placeholder"
    EXCLUDED = "excluded"


@dataclass(slots=True, frozen=True)
class MemberReward:
    """The resolved outcome of one execution of a group."""

    execution_id: str
    status: MemberStatus
    reward: float = 0.0
    """Scalar reward; only read for `valid` members."""


@dataclass(slots=True, frozen=True)
class AdvantageMetrics:
    """What the advantages of one group looked like (for logs and dashboards)."""

    num_members: int
    """All members, excluded ones included (their share of the B·N denominator)."""
    num_valid: int
    num_placeholder: int
    num_excluded: int
    reward_mean: float
    """Mean reward over the resolved (valid + placeholder) members; 0.0 when there are none."""
    reward_std: float
    """Population std of the resolved rewards; 0.0 when there are none."""
    zero_variance: bool
    """True when all resolved rewards are equal (or none resolved): every advantage is 0."""
    advantage_abs_mean: float
    """Mean |advantage| over the members that got one; 0.0 when none did."""


@dataclass(slots=True, frozen=True)
class GroupAdvantages:
    """Advantages of the resolved members of one group, keyed by execution id."""

    advantages: dict[str, float]
    """One entry per valid or placeholder member; excluded members are absent."""
    metrics: AdvantageMetrics

    @property
    def num_members(self) -> int:
        """Members that count in the B·N denominator (excluded ones too)."""
        return self.metrics.num_members


def group_advantages(
    members: Sequence[MemberReward], *, normalize_std: bool = False, eps: float = 1e-6
) -> GroupAdvantages:
    """Advantages `r - mean` (or `(r - mean) / (std + eps)`) over the resolved members of a group."""
    if eps < 0.0:
        raise ValueError(f"eps must be >= 0; got {eps}")
    seen: set[str] = set()
    for m in members:
        if m.execution_id in seen:
            raise ValueError(f"execution {m.execution_id!r} appears twice in one group")
        seen.add(m.execution_id)
        if m.status is MemberStatus.VALID and not math.isfinite(m.reward):
            raise ValueError(f"execution {m.execution_id!r} has a non-finite reward {m.reward}")

    resolved = [m for m in members if m.status is not MemberStatus.EXCLUDED]
    rewards = [m.reward if m.status is MemberStatus.VALID else 0.0 for m in resolved]
    n = len(rewards)
    mean = math.fsum(rewards) / n if n else 0.0
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / n) if n else 0.0
    zero_variance = all(r == rewards[0] for r in rewards)

    advantages: dict[str, float] = {}
    for m, r in zip(resolved, rewards, strict=True):
        if zero_variance:
            a = 0.0
        elif normalize_std:
            a = (r - mean) / (std + eps)
        else:
            a = r - mean
        advantages[m.execution_id] = a

    metrics = AdvantageMetrics(
        num_members=len(members),
        num_valid=sum(m.status is MemberStatus.VALID for m in members),
        num_placeholder=sum(m.status is MemberStatus.PLACEHOLDER for m in members),
        num_excluded=sum(m.status is MemberStatus.EXCLUDED for m in members),
        reward_mean=mean,
        reward_std=std,
        zero_variance=zero_variance,
        advantage_abs_mean=math.fsum(abs(a) for a in advantages.values()) / n if n else 0.0,
    )
    return GroupAdvantages(advantages=advantages, metrics=metrics)
