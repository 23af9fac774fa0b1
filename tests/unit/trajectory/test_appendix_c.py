"""An execution shaped like the paper's Appendix C case (execution f3ad38e5: 636 requests, a main
agent and a catalog sub-agent that each compact, 10 candidate trajectories): the tree stores the
shared prefixes once, and its counts match the execution's logical structure exactly."""

from __future__ import annotations

from collections import Counter

from gyre.trajectory import admit, materialize
from gyre.trajectory.stats import tree_stats

from .harness_sim import SimulatedExecution


def _appendix_c_execution() -> SimulatedExecution:
    sim = SimulatedExecution(seed=2026, tool_prob=0.9, text_len=(4, 12))
    main_retries = {20, 75, 170, 200}
    sub_retries = {30, 120}
    sub = None
    for i in range(230):
        if i == 40:
            sub = sim.delegate()
        if sub is not None and 40 <= i < 215:
            k = i - 40
            if k == 110:
                sim.compact(sub)
            sim.step(sub, retry=k in sub_retries)
        if i == 150:
            sim.compact()
        if i == 215 and sub is not None:
            sim.finish_sub(sub)
            sub = None
        sim.step(retry=i in main_retries)
    return sim


def test_appendix_c_shaped_execution_shares_prefixes() -> None:
    sim = _appendix_c_execution()
    tree = sim.tree
    stats = tree_stats(tree)
    assert sim.num_requests > 400
    assert stats.roots_by_agent == {"main": 1, "sub": 1}
    assert stats.leaves_by_class == {"main": 5, "main_summary": 1, "sub_agent": 3, "sub_agent_summary": 1}
    # Exact counts from the execution's logical structure, computed without the tree.
    assert stats.num_nodes == sim.expected_nodes()
    keys = [c.leaf_key for c in sim.commits]
    extended = {k[:i] for k in keys for i in range(1, len(k))}
    leaf_keys = {k for k in keys if k not in extended}
    assert len(leaf_keys) == 10
    assert stats.expanded_message_nodes == sum(len(k) - 1 for k in leaf_keys)
    # Shared representation (the paper: 1,347 unique nodes against 1,716 occurrences over 10 paths).
    assert stats.expanded_message_nodes > 1.2 * stats.num_message_nodes
    assert stats.expanded_tokens > 1.2 * stats.unique_tokens
    paths = sorted(stats.path_message_nodes)
    assert paths[0] < 100 < 250 < paths[-1]
    # The main agent's and the sub-agent's summary leaves sit on long pre-compaction prefixes.
    summary = [leaf for leaf in tree.leaves() if leaf.request_kind == "summary"]
    assert sorted(leaf.agent_kind for leaf in summary) == ["main", "sub"]
    assert all(leaf.depth > 150 for leaf in summary)
    # Admission: J_max = 5 by priority; every admitted target is trained once.
    admitted = admit(tree, j_max=5, seed=0)
    assert [a.leaf_class for a in admitted][:1] == ["main"]
    assert len(admitted) == 5
    rows = materialize(tree, admitted)
    assert sum(r.num_targets for r in rows) == sum(a.num_targets for a in admitted)
    assert sum(len(r.token_ids) for r in rows) < stats.expanded_tokens
    uncapped = admit(tree, j_max=None, seed=0)
    assert sum(a.num_targets for a in uncapped) == stats.sampled_tokens
    assert Counter(a.leaf_class for a in uncapped)["main"] <= 5
