"""Property tests over generated branching executions (compaction, sub-agents, retries,
re-serialized tool inputs, abandoned calls): the tree stores each thing once and admission keeps
its promises."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.trajectory import admit, materialize
from gyre.trajectory.admission import AdmittedTrajectory, trainable_node_ids
from gyre.trajectory.profiles import LEAF_PRIORITY
from gyre.trajectory.tree import TrajectoryTree

from .harness_sim import SimulatedExecution, node_sampled_ids, run_script, sampled_token_total

ACTIONS = st.lists(
    st.sampled_from(
        ["step", "step", "step", "retry", "abandon", "compact", "sub", "sub", "sub_compact", "sub_end"]
    ),
    min_size=1,
    max_size=24,
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(seed=st.integers(0, 2**16), actions=ACTIONS)
def test_tree_stores_every_message_and_sampled_token_once(seed: int, actions: list[str]) -> None:
    sim = run_script(seed, actions)
    tree = sim.tree
    # The tree is exactly the logical tree of the execution: no duplicate, no spurious branch.
    assert len(tree.nodes) == sim.expected_nodes()
    for node in tree.nodes.values():
        digests = [c.digest for c in node.child_nodes]
        assert len(digests) == len(set(digests)), "a message is stored twice under one parent"
    # Every engine-sampled token lives in exactly one node, as the engine emitted it.
    assert sum(n.num_sampled for n in tree.nodes.values()) == sampled_token_total(sim)
    for commit in sim.commits:
        assert node_sampled_ids(sim, commit.node_id) == commit.output_ids
    for node in tree.nodes.values():
        assert len(node.logprobs) == node.num_sampled


def _check_admission(tree: TrajectoryTree, admitted: list[AdmittedTrajectory], j_max: int | None) -> None:
    if j_max is not None:
        assert len(admitted) <= j_max
    masked: set[int] = set()
    seen: set[int] = set()
    leaves = tree.leaves()

    def unmasked(leaf_id: int, masked: set[int]) -> int:
        """Unmasked trainable tokens on a leaf's path, recomputed independently of the implementation."""
        return sum(n.num_sampled for n in tree.nodes[leaf_id].path() if n.node_id not in masked)

    for a in admitted:
        available = {
            c
            for c in LEAF_PRIORITY
            if any(leaf.leaf_class is c and unmasked(leaf.node_id, masked) for leaf in leaves)
        }
        best = next(c for c in LEAF_PRIORITY if c in available)
        assert a.leaf_class is best, "a lower-priority class was drawn while a higher one had tokens"
        assert a.num_targets == unmasked(a.leaf_id, masked) > 0
        assert a.target_node_ids.isdisjoint(seen), "targets overlap"
        assert all(tree.nodes[i].num_sampled for i in a.target_node_ids)
        seen |= a.target_node_ids
        masked |= set(a.path_ids)
    if j_max is None or len(admitted) < j_max:
        assert all(
            sum(n.num_sampled for n in leaf.path() if n.node_id not in masked) == 0 for leaf in leaves
        ), "admission stopped while trainable tokens were left"


@SETTINGS
@given(seed=st.integers(0, 2**16), actions=ACTIONS, admit_seed=st.integers(0, 1000), j_max=st.integers(1, 6))
def test_admission_is_disjoint_bounded_and_by_priority(
    seed: int, actions: list[str], admit_seed: int, j_max: int
) -> None:
    tree = run_script(seed, actions).tree
    admitted = admit(tree, j_max=j_max, seed=admit_seed)
    _check_admission(tree, admitted, j_max)
    assert admit(tree, j_max=j_max, seed=admit_seed) == admitted, "admission is not deterministic"


@SETTINGS
@given(seed=st.integers(0, 2**16), actions=ACTIONS, admit_seed=st.integers(0, 1000))
def test_uncapped_admission_covers_all_trainable_tokens_and_rows_target_only_sampled(
    seed: int, actions: list[str], admit_seed: int
) -> None:
    sim = run_script(seed, actions)
    tree = sim.tree
    admitted = admit(tree, j_max=None, seed=admit_seed)
    _check_admission(tree, admitted, None)
    union = set().union(*(a.target_node_ids for a in admitted)) if admitted else set()
    assert union == trainable_node_ids(tree)
    rows = materialize(tree, admitted)
    assert sum(r.num_targets for r in rows) == sum(n.num_sampled for n in tree.nodes.values())
    for row, a in zip(rows, admitted, strict=True):
        path = [tree.nodes[i] for i in a.path_ids]
        sampled = np.concatenate(
            [n.sampled if n.sampled is not None else np.zeros(n.num_tokens, bool) for n in path]
        )
        assert row.token_ids.tolist() == np.concatenate([n.token_ids for n in path]).tolist()
        assert not (row.target_mask & ~sampled).any(), "a supplied token became a target"
        assert (row.behaviour_logprobs[~row.target_mask] == 0).all()
        assert (row.policy_versions[row.target_mask] == 3).all()


def test_rejected_calls_leave_no_trace() -> None:
    sim = SimulatedExecution(3)
    sim.step()
    sim.abandon()
    sim.step()
    assert len(sim.tree.nodes) == sim.expected_nodes()
