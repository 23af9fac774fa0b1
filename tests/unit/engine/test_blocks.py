"""Block accounting and the prefix cache: invariants under random use, LRU, version isolation."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.cell_agent.engine.blocks import BlockManager, version_root

BS = 4


def _hold_prefix(bm: BlockManager, version: str, tokens: list[int]) -> list[int]:
    """Allocate blocks for `tokens` and index every full block (as a finished request would)."""
    parent: object = version_root(version)
    blocks = []
    for i in range(0, len(tokens), BS):
        block = bm.allocate()
        assert block is not None
        blocks.append(block)
        chunk = tokens[i : i + BS]
        parent = bm.insert(parent, chunk, block)
    return blocks


def test_match_reuses_full_blocks_then_copies_a_partial_one() -> None:
    bm = BlockManager(16, BS)
    tokens = list(range(10))  # 2 full blocks + a partial of 2
    blocks = _hold_prefix(bm, "v1", tokens)
    bm.release(blocks)
    match = bm.match(version_root("v1"), [*tokens, 99], max_tokens=10)
    assert match.blocks == blocks[:2]
    assert match.partial is not None and match.partial.block == blocks[2] and match.partial_tokens == 2
    assert match.num_tokens(BS) == 10
    # a diverging suffix matches the common part of the partial entry only
    match = bm.match(version_root("v1"), [*tokens[:9], 77, 78], max_tokens=10)
    assert match.blocks == blocks[:2] and match.partial_tokens == 1
    bm.check_invariants()


def test_entries_of_another_weight_version_are_never_matched() -> None:
    bm = BlockManager(16, BS)
    tokens = list(range(12))
    bm.release(_hold_prefix(bm, "v1", tokens))
    assert bm.match(version_root("v2"), tokens, 11).num_tokens(BS) == 0
    assert bm.match(version_root("v1"), tokens, 11).num_tokens(BS) == 11


def test_lru_evicts_the_least_recently_used_chain_and_its_descendants() -> None:
    bm = BlockManager(7, BS)  # 6 usable blocks
    a = _hold_prefix(bm, "v", [1] * 8)  # 2 blocks
    b = _hold_prefix(bm, "v", [2] * 8)  # 2 blocks
    bm.release(a)
    bm.release(b)
    bm.match(version_root("v"), [1] * 9, 8)  # touch chain a: b becomes the LRU chain
    held = bm.allocate_many(4)  # needs 2 evictions beyond the 2 free blocks
    assert held is not None
    assert bm.match(version_root("v"), [2] * 9, 8).num_tokens(BS) == 0
    assert bm.match(version_root("v"), [1] * 9, 8).num_tokens(BS) == 8
    bm.check_invariants()


def test_allocation_fails_only_when_every_block_is_held() -> None:
    bm = BlockManager(4, BS)
    held = bm.allocate_many(3)
    assert held is not None and bm.allocate() is None and bm.allocate_many(1) is None
    bm.release(held)
    assert bm.num_free == 3


def test_flush_drops_entries_but_not_held_blocks() -> None:
    bm = BlockManager(8, BS)
    held = _hold_prefix(bm, "v", list(range(8)))
    dropped = bm.flush()
    assert dropped == 2 and bm.num_cached == 0 and bm.num_in_use == 2
    bm.release(held)
    assert bm.num_free == 7 and bm.num_cached == 0
    bm.check_invariants()


def test_release_of_an_unheld_block_is_an_invariant_violation() -> None:
    bm = BlockManager(4, BS)
    block = bm.allocate()
    assert block is not None
    bm.decref(block)
    with pytest.raises(AssertionError):
        bm.decref(block)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(1, 120))
def test_random_use_keeps_every_block_in_exactly_one_state(seed: int, num_ops: int) -> None:
    rng = random.Random(seed)
    bm = BlockManager(12, BS)
    owners: list[list[int]] = []
    for _ in range(num_ops):
        op = rng.choice(["request", "release", "flush", "match"])
        if op == "request":
            tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 14))]
            match = bm.match(version_root(rng.choice("ab")), tokens, len(tokens) - 1)
            for block in match.blocks:
                bm.incref(block)
            need = -(-len(tokens) // BS) - len(match.blocks)
            fresh = bm.allocate_many(need)
            if fresh is None:
                bm.release(match.blocks)
                continue
            blocks = match.blocks + fresh
            parent = match.parent
            for i in range(len(match.blocks), len(blocks)):
                chunk = tokens[i * BS : (i + 1) * BS]
                parent = bm.insert(parent, chunk, blocks[i])
            owners.append(blocks)
        elif op == "release" and owners:
            bm.release(owners.pop(rng.randrange(len(owners))))
        elif op == "flush":
            bm.flush()
        else:
            tokens = [rng.randrange(3) for _ in range(8)]
            bm.match(version_root("a"), tokens, 7)
        bm.check_invariants()
        assert bm.num_in_use == len({b for blocks in owners for b in blocks})
    for blocks in owners:
        bm.release(blocks)
    bm.check_invariants()
    assert bm.num_in_use == 0
