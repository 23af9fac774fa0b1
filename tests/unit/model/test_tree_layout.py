"""`TreeLayout`: positions, predecessors, reach, chains and the ancestor-only mask of tree rows,
checked against a direct walk of the parent pointers; malformed layouts are refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.model.tree_layout import TreeLayout

# root [0,3) → a [3,5) → (c [5,6), d [6,9)); root → b [9,13)
ROW = TreeLayout.single_row(lengths=[3, 2, 1, 3, 4], parents=[-1, 0, 1, 1, 0])


def test_positions_are_depths_along_each_path() -> None:
    assert ROW.position_ids().tolist() == [0, 1, 2, 3, 4, 5, 5, 6, 7, 3, 4, 5, 6]


def test_predecessors_jump_to_the_parent_at_a_branch() -> None:
    previous = ROW.predecessors().tolist()
    assert previous[0] == -1
    assert previous[5] == 4  # c follows a directly
    assert previous[6] == 4  # d's first token is predicted by a's last token, not by c
    assert previous[9] == 2  # b hangs off the root
    assert previous[10] == 9


def test_chains_cover_the_row_in_order_with_their_ancestors_as_context() -> None:
    chains = [(c.start, c.end, c.context.tolist()) for c in ROW.chains()]
    assert chains == [(0, 6, []), (6, 9, [0, 1, 2, 3, 4]), (9, 13, [0, 1, 2])]
    assert ROW.num_leaves().tolist() == [3]


def test_mask_is_exactly_the_ancestor_relation() -> None:
    mask = ROW.mask()
    paths = [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 6, 7, 8], [0, 1, 2, 9, 10, 11, 12]]
    for t in range(13):
        on_path = next(p for p in paths if t in p)
        expected = set(on_path[: on_path.index(t) + 1])
        assert set(np.flatnonzero(mask[t])) == expected, t


def test_rows_concatenate_and_slice_back() -> None:
    paths = TreeLayout.path_rows([4, 2])
    both = TreeLayout.concat([paths, ROW, TreeLayout.path_rows([1])])
    assert both.num_rows == 4 and both.cu_seqlens().tolist() == [0, 4, 6, 19, 20]
    assert both.position_ids().tolist() == [0, 1, 2, 3, 0, 1, *ROW.position_ids().tolist(), 0]
    middle = both.rows(2, 3)
    assert middle.segment_parents.tolist() == ROW.segment_parents.tolist()
    assert middle.position_ids().tolist() == ROW.position_ids().tolist()
    # rows never see each other
    mask = both.mask()
    assert not mask[6:19, :6].any() and not mask[19, :19].any()
    assert paths.is_paths and not both.is_paths


@pytest.mark.parametrize(
    ("lengths", "parents", "match"),
    [
        ([2, 2], [0, -1], "root"),
        ([2, 2], [-1, -1], "root"),
        ([2, 0], [-1, 0], "at least one token"),
        ([2, 2, 2, 2], [-1, 0, 0, 1], "depth-first"),
        ([2, 2], [-1, 5], "depth-first"),
        ([2, 2], [-1], "one entry per segment"),
    ],
)
def test_malformed_layouts_are_refused(lengths: list[int], parents: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TreeLayout.single_row(lengths, parents)


def test_bad_row_boundaries_are_refused() -> None:
    with pytest.raises(ValueError, match="row_segments"):
        TreeLayout(np.array([0, 0, 2], np.int32), np.array([1, 1], np.int32), np.array([-1, -1], np.int32))
    with pytest.raises(ValueError, match="outside"):
        ROW.rows(0, 2)


@st.composite
def random_tree(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """A random tree in depth-first order: each new segment hangs under a node of the open path."""
    n = draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    parents, open_path = [-1], [0]
    for g in range(1, n):
        keep = draw(st.integers(1, len(open_path)))
        open_path = open_path[:keep]
        parents.append(open_path[-1])
        open_path.append(g)
    return lengths, parents


@settings(max_examples=200, deadline=None)
@given(tree=random_tree())
def test_derived_arrays_agree_with_a_walk_of_the_parents(tree: tuple[list[int], list[int]]) -> None:
    lengths, parents = tree
    layout = TreeLayout.single_row(lengths, parents)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    segment_of = np.repeat(np.arange(len(lengths)), lengths)

    def path_tokens(g: int) -> list[int]:
        chain = []
        while g >= 0:
            chain.append(g)
            g = parents[g]
        return [t for s in reversed(chain) for t in range(starts[s], starts[s] + lengths[s])]

    mask, positions, previous = layout.mask(), layout.position_ids(), layout.predecessors()
    for t in range(layout.num_tokens):
        path = path_tokens(int(segment_of[t]))
        upto = path[: path.index(t) + 1]
        assert set(np.flatnonzero(mask[t])) == set(upto)
        assert positions[t] == len(upto) - 1
        assert previous[t] == (upto[-2] if len(upto) > 1 else -1)
    chains = layout.chains()
    assert [c.start for c in chains] == sorted(c.start for c in chains)
    assert sum(c.end - c.start for c in chains) == layout.num_tokens
    assert len(chains) == int(layout.num_leaves()[0])
    for c in chains:
        assert path_tokens(int(segment_of[c.end - 1])) == [*c.context.tolist(), *range(c.start, c.end)]
