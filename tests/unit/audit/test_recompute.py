"""The packer's work recomputed by the audit (app/audit/recompute.py): hand-computed advantages, the
admission order by role priority, and agreement with the packer's own code (gyre/rl/advantages.py,
gyre/trajectory/admission.py, materialize.py) on simulated branching executions."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.audit.recompute import STD_EPS, admit_paths, expected_rows, recompute_advantages
from gyre.rl.advantages import MemberReward, MemberStatus, group_advantages
from gyre.trajectory import admit, materialize
from gyre.trajectory.profiles import LeafClass
from tests.unit.trajectory.harness_sim import run_script

ACTIONS = st.lists(
    st.sampled_from(["step", "step", "retry", "compact", "sub", "sub", "sub_compact", "sub_end", "parallel"]),
    min_size=1,
    max_size=20,
)


def test_advantages_by_hand():
    two_two = {"a": ("valid", 1.0), "b": ("valid", 0.0), "c": ("valid", 0.0), "d": ("valid", 1.0)}
    assert recompute_advantages(two_two, normalize_std=False) == {"a": 0.5, "b": -0.5, "c": -0.5, "d": 0.5}
    # a placeholder counts 0 whatever reward it carries; an excluded member gets none and is not averaged
    mixed = {"a": ("valid", 1.0), "p": ("placeholder", 0.7), "x": ("excluded", 1.0)}
    assert recompute_advantages(mixed, normalize_std=False) == {"a": 0.5, "p": -0.5}
    # std of (1, 0) is 0.5
    normalized = recompute_advantages({"a": ("valid", 1.0), "b": ("valid", 0.0)}, normalize_std=True)
    assert normalized == {"a": 0.5 / (0.5 + STD_EPS), "b": -0.5 / (0.5 + STD_EPS)}
    same = {"a": ("valid", 0.3), "b": ("valid", 0.3), "x": ("excluded", 0.0)}
    assert recompute_advantages(same, normalize_std=True) == {"a": 0.0, "b": 0.0}
    assert recompute_advantages({"x": ("excluded", 1.0)}, normalize_std=False) == {}


@pytest.mark.parametrize("normalize_std", [False, True])
def test_advantages_equal_the_packers_to_the_bit(normalize_std):
    rng = np.random.default_rng(7)
    for _ in range(200):
        members = {}
        for k in range(int(rng.integers(1, 9))):
            status = str(rng.choice(["valid", "valid", "valid", "placeholder", "excluded"]))
            members[f"e{k}"] = (status, float(rng.choice([0.0, 0.25, 1.0, rng.random()])))
        theirs = group_advantages(
            [MemberReward(e, MemberStatus(s), r) for e, (s, r) in members.items()],
            normalize_std=normalize_std,
        )
        assert recompute_advantages(members, normalize_std=normalize_std) == theirs.advantages


def test_admission_takes_main_leaves_before_the_sub_agents():
    tree = run_script(3, ["step", "sub", "step", "sub", "retry", "sub"]).tree
    classes = {leaf.leaf_class for leaf in tree.leaves()}
    assert {LeafClass.MAIN, LeafClass.SUB_AGENT} <= classes
    drawn = admit_paths(tree, j_max=10, seed=0)
    ranks = [[LeafClass.MAIN, LeafClass.SUB_AGENT].index(a.path[-1].leaf_class) for a in drawn]
    assert ranks == sorted(ranks) and ranks[0] == 0 and ranks[-1] == 1
    assert len(admit_paths(tree, j_max=1, seed=0)) == 1
    targets = [a.targets for a in drawn]
    assert all(not (x & y) for i, x in enumerate(targets) for y in targets[i + 1 :]), "targets are disjoint"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), actions=ACTIONS, admit_seed=st.integers(0, 10**6), j_max=st.integers(1, 8))
def test_admission_and_rows_equal_the_packers(seed, actions, admit_seed, j_max):
    tree = run_script(seed, actions).tree
    theirs = admit(tree, j_max=j_max, seed=admit_seed)
    mine = admit_paths(tree, j_max=j_max, seed=admit_seed)
    assert [tuple(n.node_id for n in a.path) for a in mine] == [a.path_ids for a in theirs]
    assert [a.targets for a in mine] == [a.target_node_ids for a in theirs]
    for layout in ("paths", "tree"):
        rows = materialize(tree, theirs, layout)
        expected = expected_rows(tree, mine, row_layout=layout)
        assert len(expected) == len(rows)
        for want, row in zip(expected, rows, strict=True):
            assert np.array_equal(want.token_ids, row.token_ids)
            assert np.array_equal(want.target_mask, row.target_mask)
            assert not (want.target_mask & ~want.sampled).any()
            targets = row.target_mask
            assert np.array_equal(want.behaviour_logprobs[targets], row.behaviour_logprobs[targets])
            assert np.array_equal(want.versions[targets], row.policy_versions[targets])
            assert np.array_equal(want.predecessors, row.layout.predecessors())


def test_rows_hold_each_node_once_and_mark_only_sampled_tokens():
    tree = run_script(11, ["step", "step", "retry", "step", "sub", "sub", "retry", "compact", "step"]).tree
    drawn = admit_paths(tree, j_max=8, seed=1)
    rows = expected_rows(tree, drawn, row_layout="tree")
    union = {n.node_id for a in drawn for n in a.path}
    assert sum(len(r.token_ids) for r in rows) == sum(tree.nodes[i].num_tokens for i in union)
    assert sum(int(r.sampled.sum()) for r in rows) == sum(tree.nodes[i].num_sampled for i in union)
    assert sum(r.num_targets for r in rows) == sum(
        tree.nodes[i].num_sampled for a in drawn for i in a.targets
    )
    with pytest.raises(ValueError, match="row_layout 'flat' is neither paths nor tree"):
        expected_rows(tree, drawn, row_layout="flat")
