"""`TreeLayout`: the shape of tree-packed rows — what a model needs beyond `cu_seqlens` to train a
row that holds several root-to-leaf paths of one execution, each shared prefix once.

A tree row stores the union of an execution's admitted paths under one root in tree order
(depth first: a node before its children, children in commit order). Its tokens fall into
*segments*, maximal runs of tree nodes without a branch, so a row of J leaves has at most 2J - 1
segments however many messages it holds. A layout describes S packed rows:

    row_segments     [S+1]  row r holds segments row_segments[r]:row_segments[r+1]
    segment_lengths  [N]    tokens of each segment (>= 1), in tree order
    segment_parents  [N]    parent of each segment as an index inside its row; -1 for the row's
                            first segment (its root) and only for it

A path row is a row of one segment. Everything else is derived here, in numpy:

- positions: a token at offset o of segment g sits at depth(g) + o, depth(g) = tokens of g's
  ancestors — the position it has in its own path row;
- attention: token t attends token s iff s is on t's root-to-leaf path and s <= t. In tree order
  that is `s <= t < reach[s]`, `reach[s]` = the end of the subtree of s's segment (`reach`);
- predecessors: the logits that predict token t are those of t - 1, except at the first token of a
  segment whose parent is not the segment just before it: there it is the parent's last token;
- chains (how `gyre.model.attention` computes it): a row splits into one chain per leaf, a segment
  followed by its first child, that child's first child, ... down to a leaf. A chain is contiguous
  in tree order, and each of its queries attends the chain's *context* (all tokens of the ancestors
  of the chain's first segment) plus the chain itself causally.

Pure numpy: the packer imports it; in the micro-step codec it costs 8 bytes per segment and 4 per row.

    layout = TreeLayout.single_row(lengths=[5, 3, 4], parents=[-1, 0, 0])
    layout.position_ids()   # [0..4, 5..7, 5..8]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class Chain:
    """One leaf's share of a tree row's queries: tokens [start, end) plus the context they all see."""

    start: int
    end: int
    context: npt.NDArray[np.int64]
    """Token indices (in the packed sequence, root first) of the ancestors of the chain's first segment."""


@dataclass(frozen=True, slots=True, eq=False)
class TreeLayout:
    """Segments of S packed rows (see the module docstring)."""

    row_segments: IntArray
    segment_lengths: IntArray
    segment_parents: IntArray

    def __post_init__(self) -> None:
        rows, lengths, parents = self.row_segments, self.segment_lengths, self.segment_parents
        if rows.ndim != 1 or len(rows) < 2 or rows[0] != 0 or rows[-1] != len(lengths):
            raise ValueError("row_segments must run from 0 to the segment count, one entry per row boundary")
        if np.any(np.diff(rows) <= 0):
            raise ValueError("row_segments must be strictly increasing (every row has a segment)")
        if len(parents) != len(lengths):
            raise ValueError("segment_parents needs one entry per segment")
        if np.any(lengths < 1):
            raise ValueError("every segment must hold at least one token")
        for r in range(len(rows) - 1):
            _check_tree_order(parents[rows[r] : rows[r + 1]], r)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def single_row(cls, lengths: Sequence[int] | IntArray, parents: Sequence[int] | IntArray) -> TreeLayout:
        """The layout of one row."""
        n = len(lengths)
        return cls(_i32([0, n]), _i32(lengths), _i32(parents))

    @classmethod
    def path_rows(cls, row_lengths: Sequence[int] | IntArray) -> TreeLayout:
        """Rows that are plain paths: one segment each."""
        n = len(row_lengths)
        return cls(np.arange(n + 1, dtype=np.int32), _i32(row_lengths), np.full(n, -1, np.int32))

    @classmethod
    def concat(cls, layouts: Sequence[TreeLayout]) -> TreeLayout:
        """The rows of `layouts`, one after the other."""
        if not layouts:
            raise ValueError("concat needs at least one layout")
        offsets = np.cumsum([0] + [x.num_segments for x in layouts[:-1]])
        rows = [layouts[0].row_segments[:1]] + [
            x.row_segments[1:] + o for x, o in zip(layouts, offsets, strict=True)
        ]
        return cls(
            _i32(np.concatenate(rows)),
            _i32(np.concatenate([x.segment_lengths for x in layouts])),
            _i32(np.concatenate([x.segment_parents for x in layouts])),
        )

    def rows(self, start: int, end: int) -> TreeLayout:
        """Rows [start, end) as a layout of their own (token offsets restart at 0)."""
        if not 0 <= start < end <= self.num_rows:
            raise ValueError(f"row range [{start}, {end}) is outside the layout's {self.num_rows} rows")
        a, b = int(self.row_segments[start]), int(self.row_segments[end])
        return TreeLayout(
            _i32(self.row_segments[start : end + 1] - a), self.segment_lengths[a:b], self.segment_parents[a:b]
        )

    # -- sizes ----------------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        return len(self.row_segments) - 1

    @property
    def num_segments(self) -> int:
        return len(self.segment_lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.segment_lengths.sum())

    @property
    def is_paths(self) -> bool:
        """True when every row is a single path (one segment): plain causal rows."""
        return self.num_segments == self.num_rows

    def cu_seqlens(self) -> IntArray:
        """[S+1] token boundaries of the rows."""
        starts = self.segment_starts()
        return _i32(np.append(starts[self.row_segments[:-1]], self.num_tokens))

    def num_leaves(self) -> IntArray:
        """[S] leaves (root-to-leaf paths) of each row."""
        has_child = np.zeros(self.num_segments, np.bool_)
        has_child[self._global_parents()[self.segment_parents >= 0]] = True
        return _i32(np.add.reduceat(~has_child, self.row_segments[:-1]))

    # -- derived per segment and per token --------------------------------------------------------

    def segment_starts(self) -> IntArray:
        """[N] first token of each segment in the packed sequence."""
        return _i32(np.concatenate([[0], np.cumsum(self.segment_lengths)[:-1]]))

    def _global_parents(self) -> npt.NDArray[np.int64]:
        """[N] parent segment as a global index (-1 for roots)."""
        row_first = np.repeat(self.row_segments[:-1], np.diff(self.row_segments)).astype(np.int64)
        return np.where(self.segment_parents >= 0, self.segment_parents + row_first, -1)

    def segment_depths(self) -> IntArray:
        """[N] tokens on the path above each segment."""
        parents = self._global_parents()
        depths = np.zeros(self.num_segments, np.int64)
        for g in range(self.num_segments):  # parents come first in tree order
            p = parents[g]
            if p >= 0:
                depths[g] = depths[p] + self.segment_lengths[p]
        return _i32(depths)

    def position_ids(self) -> IntArray:
        """[T] position of each token along its own root-to-leaf path."""
        starts, depths = self.segment_starts(), self.segment_depths()
        offset = np.repeat(depths - starts, self.segment_lengths)
        return _i32(np.arange(self.num_tokens) + offset)

    def predecessors(self) -> npt.NDArray[np.int64]:
        """[T] the token whose logits predict each token (-1 at the first token of a row)."""
        starts = self.segment_starts().astype(np.int64)
        ends = starts + self.segment_lengths
        previous = np.arange(self.num_tokens, dtype=np.int64) - 1
        parents = self._global_parents()
        previous[starts] = np.where(parents >= 0, ends[parents] - 1, -1)
        return previous

    def reach(self) -> npt.NDArray[np.int64]:
        """[T] for each token s, the end of its segment's subtree: t attends s iff s <= t < reach[s]."""
        starts = self.segment_starts().astype(np.int64)
        subtree_end = starts + self.segment_lengths
        parents = self._global_parents()
        for g in range(self.num_segments - 1, -1, -1):  # children after parents: fold bottom-up
            p = parents[g]
            if p >= 0:
                subtree_end[p] = max(subtree_end[p], subtree_end[g])
        return np.repeat(subtree_end, self.segment_lengths)

    def chains(self) -> list[Chain]:
        """The chains of every row, in token order (see the module docstring)."""
        starts = self.segment_starts().astype(np.int64)
        lengths = self.segment_lengths.astype(np.int64)
        parents = self._global_parents()
        out: list[Chain] = []
        g = 0
        while g < self.num_segments:
            last = g
            while last + 1 < self.num_segments and parents[last + 1] == last:
                last += 1
            ancestors: list[int] = []
            p = parents[g]
            while p >= 0:
                ancestors.append(int(p))
                p = parents[p]
            context = (
                np.concatenate([np.arange(starts[a], starts[a] + lengths[a]) for a in reversed(ancestors)])
                if ancestors
                else np.zeros(0, np.int64)
            )
            out.append(Chain(int(starts[g]), int(starts[last] + lengths[last]), context))
            g = last + 1
        return out

    def mask(self) -> npt.NDArray[np.bool_]:
        """[T, T] dense reference: entry (t, s) is True when query t attends key s."""
        reach = self.reach()
        t = np.arange(self.num_tokens)
        return (t[None, :] <= t[:, None]) & (t[:, None] < reach[None, :])


def _check_tree_order(parents: IntArray, row: int) -> None:
    """Parents of one row's segments describe a tree in depth-first order with one root, first."""
    if parents[0] != -1 or np.any(parents[1:] < 0):
        raise ValueError(f"row {row}: its first segment must be its root (parent -1) and no other")
    open_path: list[int] = [0]  # the segments from the root down to the last one seen
    for g in range(1, len(parents)):
        p = int(parents[g])
        while open_path and open_path[-1] != p:
            open_path.pop()
        if not open_path:
            raise ValueError(
                f"row {row}: segment {g} has parent {p}, which is not on the path to segment {g - 1}; "
                "segments must be in depth-first tree order"
            )
        open_path.append(g)


def _i32(values: Sequence[int] | npt.NDArray[np.integer]) -> IntArray:
    return np.ascontiguousarray(values, dtype=np.int32)
