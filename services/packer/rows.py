"""One ready group → its training rows and advantages (the packer's per-group work).

Valid members: the execution's closed tree is admitted (J_max, seeded per execution) and
materialized as path rows or tree rows (`packer.row_layout`). Placeholder members count with
reward 0 and contribute no rows. Excluded members get no advantage and no rows, but still count in
the batch's B·N denominator.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gyre.rl.advantages import GroupAdvantages, MemberReward, MemberStatus, group_advantages
from gyre.trajectory import TrajectoryTree, admit, materialize
from gyre.trajectory.materialize import RowLayout
from gyre.trajectory.row import TrajectoryRow

LoadTree = Callable[[str], Awaitable[TrajectoryTree | None]]


@dataclass(frozen=True, slots=True)
class ClaimedGroup:
    """A group the packer claimed: its dispatch version and its members' resolved outcomes."""

    group_id: str
    policy_version: int
    """v_d, for staleness."""
    members: tuple[MemberReward, ...]


@dataclass(frozen=True, slots=True)
class GroupRows:
    rows: list[TrajectoryRow]
    advantages: GroupAdvantages
    num_targets: int
    admitted_by_class: dict[str, int] = field(default_factory=dict)
    """Admitted trajectories per leaf class (`main`, `sub_agent`, …)."""
    targets_by_class: dict[str, int] = field(default_factory=dict)
    """Admitted target tokens per leaf class of the trajectory that holds them."""
    num_executions_without_targets: int = 0
    """Members that contribute no target token: placeholders, excluded members, and valid ones whose
    tree holds nothing trainable (no model call answered, or only side calls)."""

    @property
    def num_trajectories(self) -> int:
        """Admitted trajectories (a tree row holds several)."""
        return sum(r.num_trajectories for r in self.rows)


def admission_seed(run_seed: int, execution_id: str) -> int:
    """Deterministic per execution, independent of the order groups are packed in."""
    return (run_seed * 1_000_003 + zlib.crc32(execution_id.encode())) & 0x7FFFFFFF


async def group_rows(
    group: ClaimedGroup,
    load_tree: LoadTree,
    *,
    j_max: int,
    run_seed: int,
    normalize_std: bool,
    row_layout: RowLayout,
) -> GroupRows:
    advantages = group_advantages(group.members, normalize_std=normalize_std)
    rows: list[TrajectoryRow] = []
    by_class: dict[str, int] = {}
    targets_by_class: dict[str, int] = {}
    without_targets = 0
    for member in group.members:
        if member.status is not MemberStatus.VALID:
            without_targets += 1
            continue
        tree = await load_tree(member.execution_id)
        if tree is None:  # the harness never made a model call: nothing to train, L_i = 0
            without_targets += 1
            continue
        admitted = admit(tree, j_max=j_max, seed=admission_seed(run_seed, member.execution_id))
        without_targets += not any(a.num_targets for a in admitted)
        for a in admitted:
            by_class[a.leaf_class.value] = by_class.get(a.leaf_class.value, 0) + 1
            targets_by_class[a.leaf_class.value] = targets_by_class.get(a.leaf_class.value, 0) + a.num_targets
        rows.extend(materialize(tree, admitted, row_layout))
    return GroupRows(
        rows, advantages, sum(r.num_targets for r in rows), by_class, targets_by_class, without_targets
    )
