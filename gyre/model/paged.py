"""The paged KV layout the engine serves from: one slot-addressed pool per layer plus a batch descriptor.

A *slot* holds the rotated key and the value of one token for every head; the engine hands out slots
in fixed-size blocks (block `b` owns slots `b*block_size ... b*block_size + block_size - 1`) and
describes one forward step with a `PagedBatch` (built from per-row block tables):

- `positions [B, Lq]`: the position of each new token (padding queries get 0);
- `write_slots [B, Lq]`: where the K/V of each new token goes (padding writes go to the scratch slot);
- `read_blocks [B, nb]`: the blocks a row's keys live in, in position order (padded with the scratch
  block); a step reads whole blocks (one copy per block, not per token) and attends the first
  `num_keys` slots of them;
- `mask [B, 1, Lq, num_keys]` (bool): True where query i of row b may attend key j; None when every
  query attends every key (decode rows of one length), which takes SDPA's unmasked kernel;
- `row_keys` (optional): an identity per row (the engine's request ids). With them, consecutive decode
  steps of the same rows reuse the K/V gathered by the previous step (the *decode view*, below).

The decode view. Attention needs each row's K/V contiguous, so a step copies the rows' blocks out of
the pool (`gather`): on CPU that copy moves as many bytes as the attention reads, every layer and
step. Between two decode steps of the same rows only one token per row changes, so the cache keeps
the gathered K/V of every layer in a dense [B, H, capacity, D] buffer and updates it in place: the
new token of each row, plus the block columns that appear when the longest row enters a new block.
It is used only when it provably equals a fresh gather at every position a row attends: the same row
keys in the same order, each row exactly one token further, block lists unchanged (a padding entry may
become the row's new block), and no other write to the pool since the previous step — every other
writer (prefill, copy-on-write, KV import, zeroing a block the view holds) bumps the pool's `epoch`,
and a step after any of them gathers afresh. Masked positions hold finite pool values, as with a
gather. The buffer costs memory (layers x rows x capacity x K and V); above `view_budget_bytes` the
cache gathers every step as before.

Block 0 is scratch: never handed to a request; it pads the block lists of shorter rows, and slot
0 takes the writes of padding queries. It always holds finite values, so a masked key contributes
exactly zero.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from gyre.model.arch import ModelArch

SCRATCH_SLOT = 0
VIEW_BUDGET_BYTES = 256 << 20
"""Default bound of the decode view's memory (K and V of every layer, rows x capacity tokens)."""
_UNPLANNED = -2
_NO_VIEW = -1


@dataclass(slots=True)
class _DecodeView:
    """The dense K/V of the rows of the last decode step, every layer: [L, B, H, capacity, D]."""

    k: torch.Tensor
    v: torch.Tensor
    row_keys: tuple[Hashable, ...] = ()
    blocks: list[list[int]] = field(default_factory=list)  # the block rows it holds (0 = padding)
    ends: list[int] = field(default_factory=list)  # tokens it holds per row
    held: set[int] = field(default_factory=set)  # the real blocks among them
    epoch: int | None = None  # the pool epoch it mirrors; None while a step fills it

    def capacity_blocks(self, block_size: int) -> int:
        return int(self.k.shape[3]) // block_size


@dataclass(slots=True)
class PagedKVCache:
    """K and V of every layer: `k[layer, slot, kv_head, dim]` (keys are stored after rotary)."""

    k: torch.Tensor
    v: torch.Tensor
    # Reused gather outputs: a fresh multi-MiB tensor per layer and step would be mmap'ed and
    # page-faulted by the allocator every time, which costs more than the attention itself on CPU.
    _gather_k: torch.Tensor | None = None
    _gather_v: torch.Tensor | None = None
    view_budget_bytes: int = VIEW_BUDGET_BYTES
    epoch: int = 0
    """Bumped by every write to the pool that the decode view does not mirror itself."""
    _view: _DecodeView | None = None

    @classmethod
    def allocate(
        cls, arch: ModelArch, num_slots: int, block_size: int, dtype: torch.dtype = torch.float32
    ) -> PagedKVCache:
        shape = (arch.num_layers, num_slots, arch.num_kv_heads, arch.head_dim)
        # empty: pages are touched only when a slot is first written, so an idle pool costs no RSS.
        k = torch.empty(shape, dtype=dtype)
        v = torch.empty(shape, dtype=dtype)
        return cls(k=k, v=v).zero_block(0, block_size)

    @property
    def num_slots(self) -> int:
        return int(self.k.shape[1])

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V [N, H, D] of N tokens at `slots` [N]."""
        self.epoch += 1
        self._store(layer, slots, k, v)

    def _store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.dtype != self.k.dtype:  # a cast is a dispatch even when it changes nothing
            k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def copy_slots(self, dst: int, src: int, n: int) -> None:
        """Copy the K/V of slots src .. src+n-1 to dst .. dst+n-1, every layer (copy-on-write)."""
        self.epoch += 1
        self.k[:, dst : dst + n] = self.k[:, src : src + n]
        self.v[:, dst : dst + n] = self.v[:, src : src + n]

    def put_slots(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V [L, N, H, D] of every layer at `slots` [N] (a KV import)."""
        self.epoch += 1
        self.k.index_copy_(1, slots, k.to(self.k.dtype))
        self.v.index_copy_(1, slots, v.to(self.v.dtype))

    def attend(
        self, layer: int, batch: PagedBatch, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the K/V [B, Lq, H, D] of the step's new tokens, then return the K/V every row attends
        as [B, H, num_keys, D] (views valid until the next call): from the decode view when the step
        continues the previous one (see the module docstring), else gathered from the pool."""
        num_heads, head_dim = self.k.shape[2:]
        if batch.view_from == _UNPLANNED:
            batch.view_from = self._plan_view(batch)
        start = batch.view_from
        if start == _NO_VIEW:
            flat = (-1, num_heads, head_dim)
            self.write(layer, batch.write_slots.view(-1), k.reshape(flat), v.reshape(flat))
            keys, values = self.gather(layer, batch.read_blocks, batch.block_size, batch.num_keys)
            return keys.transpose(1, 2), values.transpose(1, 2)
        view = self._view
        assert view is not None
        num_rows, bs = k.shape[0], batch.block_size
        new_k, new_v = k.view(num_rows, num_heads, head_dim), v.view(num_rows, num_heads, head_dim)
        self._store(layer, batch.write_slots.view(-1), new_k, new_v)
        num_blocks = batch.read_blocks.shape[1]
        if start < num_blocks:  # block columns the view does not hold yet (all of them on a rebuild)
            pool_blocks = self.k.shape[1] // bs
            columns = batch.read_blocks[:, start:].reshape(-1)
            for pool, dense in ((self.k, view.k), (self.v, view.v)):
                picked = pool[layer].view(pool_blocks, -1).index_select(0, columns)
                head_major = picked.view(num_rows, -1, bs, num_heads, head_dim).permute(0, 3, 1, 2, 4)
                dense[layer].view(num_rows, num_heads, -1, bs, head_dim)[:, :, start:num_blocks] = head_major
        if start > 0:  # continuing: each row's new token (freshly gathered columns hold theirs already)
            rows, positions = batch.view_rows(), batch.positions.view(-1)
            view.k[layer][rows, :, positions] = new_k
            view.v[layer][rows, :, positions] = new_v
        if layer == self.k.shape[0] - 1:
            view.epoch = self.epoch
        return view.k[layer, :, :, : batch.num_keys], view.v[layer, :, :, : batch.num_keys]

    def _plan_view(self, batch: PagedBatch) -> int:
        """The block column from which this step fills the decode view (0: all of it), or _NO_VIEW."""
        keys, rows, starts = batch.row_keys, batch.block_rows, batch.starts
        if keys is None or batch.positions.shape[1] != 1 or not rows:
            return _NO_VIEW
        num_rows, num_blocks = len(rows), len(rows[0])
        view, bs = self._view, batch.block_size
        ends = [s + 1 for s in starts]
        if (
            view is not None
            and view.epoch == self.epoch
            and view.row_keys == keys
            and view.ends == starts
            and len(view.blocks[0]) <= num_blocks <= view.capacity_blocks(bs)
            and all(
                a == b or a == 0
                for old, new in zip(view.blocks, rows, strict=True)
                for a, b in zip(old, new[: len(old)], strict=True)
            )
        ):
            start = len(view.blocks[0])
        else:
            view = self._allocate_view(num_rows, num_blocks, bs)
            if view is None:
                return _NO_VIEW
            start = 0
        view.row_keys, view.blocks, view.ends, view.epoch = keys, rows, ends, None
        view.held = {b for row in rows for b in row if b}
        return start

    def _allocate_view(self, num_rows: int, num_blocks: int, block_size: int) -> _DecodeView | None:
        """The view buffers for `num_rows` rows of at least `num_blocks` blocks (reused when they fit),
        with room to grow; None when even `num_blocks` exceeds the budget."""
        view = self._view
        if (
            view is not None
            and view.k.shape[1] == num_rows
            and num_blocks <= view.capacity_blocks(block_size)
        ):
            return view
        self._view = None
        layers, _, heads, dim = self.k.shape
        per_block = layers * num_rows * block_size * heads * dim * self.k.element_size() * 2
        for capacity in (2 * num_blocks + 8, num_blocks):
            if capacity * per_block <= self.view_budget_bytes:
                shape = (layers, num_rows, heads, capacity * block_size, dim)  # head-major: SDPA's order
                self._view = _DecodeView(
                    torch.empty(shape, dtype=self.k.dtype), torch.empty(shape, dtype=self.v.dtype)
                )
                return self._view
        return None

    def gather(
        self, layer: int, blocks: torch.Tensor, block_size: int, num_keys: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the first `num_keys` slots of `blocks` [B, nb] (in order) as [B, num_keys, H, D]:
        one copy per block. The tensors are views of buffers reused by the next call: consume them
        before gathering again."""
        num_slots, num_heads, head_dim = self.k.shape[1:]
        width = block_size * num_heads * head_dim
        n = blocks.numel()
        if self._gather_k is None or self._gather_k.shape[0] < n or self._gather_k.shape[1] != width:
            self._gather_k = torch.empty((n, width), dtype=self.k.dtype)
            self._gather_v = torch.empty((n, width), dtype=self.v.dtype)
        assert self._gather_v is not None
        flat = blocks.reshape(-1)
        pool_k = self.k[layer].view(num_slots // block_size, width)
        pool_v = self.v[layer].view(num_slots // block_size, width)
        keys = torch.index_select(pool_k, 0, flat, out=self._gather_k[:n])
        values = torch.index_select(pool_v, 0, flat, out=self._gather_v[:n])
        shape = (blocks.shape[0], blocks.shape[1] * block_size, num_heads, head_dim)
        return keys.view(shape)[:, :num_keys], values.view(shape)[:, :num_keys]

    def zero_block(self, block: int, block_size: int) -> PagedKVCache:
        if self._view is not None and block in self._view.held:
            self.epoch += 1
        self.k[:, block * block_size : (block + 1) * block_size].zero_()
        self.v[:, block * block_size : (block + 1) * block_size].zero_()
        return self

    def nbytes(self) -> int:
        return self.k.nelement() * self.k.element_size() * 2


@dataclass(slots=True)
class PagedBatch:
    """One forward step over B rows of Lq new tokens each, attending `num_keys` cached keys."""

    positions: torch.Tensor
    write_slots: torch.Tensor
    read_blocks: torch.Tensor
    num_keys: int
    block_size: int
    mask: torch.Tensor | None
    block_rows: list[list[int]] = field(default_factory=list)  # read_blocks as lists
    starts: list[int] = field(default_factory=list)
    row_keys: tuple[Hashable, ...] | None = None
    view_from: int = _UNPLANNED  # set by the cache at the step's first layer

    def view_rows(self) -> torch.Tensor:
        return torch.arange(len(self.starts))

    @classmethod
    def from_block_tables(
        cls,
        block_tables: list[list[int]],
        starts: list[int],
        counts: list[int],
        block_size: int,
        row_keys: Sequence[Hashable] | None = None,
    ) -> PagedBatch:
        """Row b computes `counts[b]` new tokens at positions `starts[b] ...` and attends positions
        `0 .. starts[b] + counts[b] - 1`; its KV lives in the blocks `block_tables[b]` (position p is
        slot `block_tables[b][p // block_size] * block_size + p % block_size`). `row_keys`: an
        identity per row, which lets consecutive decode steps of the same rows share gathered K/V."""
        num_rows = len(block_tables)
        assert num_rows == len(starts) == len(counts) and num_rows > 0
        ends = [s + c for s, c in zip(starts, counts, strict=True)]
        lq, lk = max(counts), max(ends)
        num_blocks = -(-lk // block_size)
        rows = []
        for blocks, end, count in zip(block_tables, ends, counts, strict=True):
            assert end <= len(blocks) * block_size and count >= 1
            used = blocks[:num_blocks]
            rows.append(used + [0] * (num_blocks - len(used)))
        read = torch.tensor(rows, dtype=torch.long)
        if lq == 1:
            # Decode: positions, slots and the mask in Python (a handful of ops, not ~20 tensor ops).
            positions = torch.tensor([[s] for s in starts], dtype=torch.long)
            write = torch.tensor(
                [
                    [t[s // block_size] * block_size + s % block_size]
                    for t, s in zip(rows, starts, strict=True)
                ],
                dtype=torch.long,
            )
            mask = None
            if min(ends) != lk:
                mask = (torch.arange(lk).view(1, lk) < torch.tensor(ends).view(num_rows, 1)).view(
                    num_rows, 1, 1, lk
                )
            keys = tuple(row_keys) if row_keys is not None else None
            return cls(positions, write, read, lk, block_size, mask, rows, list(starts), keys)
        start = torch.tensor(starts, dtype=torch.long).view(num_rows, 1)
        count = torch.tensor(counts, dtype=torch.long).view(num_rows, 1)
        i = torch.arange(lq).view(1, lq)
        j = torch.arange(lk)
        valid_q = i < count
        positions = torch.where(valid_q, start + i, 0)
        write = read.gather(1, (positions // block_size).clamp(max=num_blocks - 1)) * block_size
        write = torch.where(valid_q, write + positions % block_size, SCRATCH_SLOT)
        attend = (j.view(1, 1, lk) <= (start + i).unsqueeze(-1)) & valid_q.unsqueeze(-1)
        # A padding query attends key 0 only, so its softmax is finite (its output is discarded).
        attend |= (~valid_q).unsqueeze(-1) & (j.view(1, 1, lk) == 0)
        return cls(positions, write, read, lk, block_size, attend.unsqueeze(1), rows, list(starts))
