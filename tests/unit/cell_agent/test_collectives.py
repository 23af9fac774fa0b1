"""The cells' world: prefix reductions and broadcasts, pair broadcasts, and a prefix group that keeps
working after a higher cell died (three spawned processes, gloo on loopback)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from tests.unit.cell_agent.workers import collectives_worker


@pytest.mark.slow
def test_prefix_and_pair_groups_survive_a_dead_cell() -> None:
    ctx = mp.get_context("spawn")
    ports, results = ctx.Queue(), ctx.Queue()
    world = 3
    procs = [ctx.Process(target=collectives_worker, args=(r, world, ports, results)) for r in range(world)]
    for p in procs:
        p.start()
    got = [results.get(timeout=90) for _ in range(world + world - 1)]
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    full = {r: (grads, params, pair) for r, phase, grads, params, pair in got if phase == "full"}
    assert full[0][0] == [6.0] * 5, "core holds the SUM of 1 + 2 + 3"
    assert all(full[r][1] == [7.0] * 5 for r in range(world)), "broadcast reaches every participant"
    assert full[2][2] == [0.0, 1.0, 2.0] and full[1][2] == [0.0, 0.0, 0.0], "pair {0, 2} only"
    after = {r: grads for r, phase, grads, _, _ in got if phase == "after_death"}
    assert after[0] == [3.0] * 5 and set(after) == {0, 1}
